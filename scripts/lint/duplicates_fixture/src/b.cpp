// A fixture of scripts/lint/duplicates.py: b.cpp repeats six lines of the other file, which it must report.
int b_step(int x) {
  int y = x + 1;
  y = y * 2;
  y = y - 3;
  y = y / 4;
  y = y % 5;
  return y + x;
}
