// The unit that builds cmake/torch_pch.cmake's precompiled header; it has no code of its own.
