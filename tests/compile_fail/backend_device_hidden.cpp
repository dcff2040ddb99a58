// Must not compile: a backend module (`cgt.host`, `cgt.cuda`, `cgt.torch`) gives a program its
// device as a view (`Pool::device()`) and hides the engine's side of it: the backend's device
// class (a `backend::Device`) and its backend traits `Backend` (whose members take and give
// engine types) cannot be named, and the view has none of the engine's members. The build picks
// the backend (CGT_HOST, CGT_CUDA or CGT_TORCH) and the line (HIDDEN_NAME), one line per target:
// clang makes a hidden name's neighbours visible once it reported one. Every marked line must fail
// with "must be imported from module 'cgt.<backend>...'" or "no member named".
// (tests/device_surface.hpp states the same of the view's members as concepts, for each backend's
// tests; `backend_names_hidden.cpp` checks what `import cgt;` hides.)
import cgt;
#if defined(CGT_HOST)
import cgt.host;
namespace under_test = cgt::host;
#define ENGINE_SIDE HostDevice
#elif defined(CGT_CUDA)
import cgt.cuda;
namespace under_test = cgt::cuda;
#define ENGINE_SIDE CudaDevice
#elif defined(CGT_TORCH)
import cgt.torch;
namespace under_test = cgt::torch;
#define ENGINE_SIDE TorchDevice
#endif

// The backend traits the handle templates are instantiated with.
#if HIDDEN_NAME == 1
using Traits = under_test::Backend;  // expect-error
#endif
// The engine's side of the device (ENGINE_SIDE: HostDevice, CudaDevice, TorchDevice).
#if HIDDEN_NAME == 2
using EngineSide = under_test::ENGINE_SIDE;  // expect-error
#endif
// Its members, through the program's view.
#if HIDDEN_NAME == 3
auto* const shut = &under_test::Device::shutdown;  // expect-error
#endif
#if HIDDEN_NAME == 4
auto* const book = &under_test::Device::checkpoint;  // expect-error
#endif
#if HIDDEN_NAME == 5
auto* const blocks = &under_test::Device::live_blocks;  // expect-error
#endif
#if HIDDEN_NAME == 6
auto* const run = &under_test::Device::run;  // expect-error
#endif
