// Uses the installed headers and library: a tiny autograd computation.
#include <dpar/dpar.h>

#include <cstdio>

int main() {
  dpar::Tensor w = dpar::Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).set_requires_grad();
  dpar::sum(dpar::mul(w, w)).backward();
  const auto g = w.grad().to_float_vector();
  std::printf("dpar %s: grad = %g %g %g\n", dpar::version().c_str(), g[0], g[1], g[2]);
  return (g[0] == 2 && g[1] == 4 && g[2] == 6) ? 0 : 1;
}
