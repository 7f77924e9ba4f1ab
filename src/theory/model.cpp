#include "theory/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.h"
#include "util/rng.h"

namespace phasekv::theory {

namespace {

template <typename T>
void check_range(const char* flag, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi))
    throw Error(fmt::format("--{} must be in [{}, {}], got {}", flag, lo, hi, value));
}

// Stable softmax of v[0..n) in place.
void softmax(double* v, int n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, v[i]);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += (v[i] = std::exp(v[i] - mx));
  for (int i = 0; i < n; ++i) v[i] /= sum;
}

double exp_entropy(const double* p, int n) {
  double h = 0.0;
  for (int i = 0; i < n; ++i)
    if (p[i] > 0.0) h -= p[i] * std::log(p[i]);
  return std::exp(h);
}

double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Standard normal by Box-Muller on the portable uniform (std::normal_distribution differs
// between standard libraries).
double normal(Rng& rng) {
  const double u1 = 1.0 - uniform01(rng), u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Per-context work space: gates [branch][h][l][r] flattened, and their adjoints.
struct Work {
  std::vector<double> gate, dgate, alpha, dalpha, w, dw, z;
};

}  // namespace

void validate(const ModelConfig& c) {
  check_range("heads", c.heads, 1, 64);
  check_range("stride", c.stride, 2, 64);
  check_range("chunks", c.chunks, 1, 256);
  check_range("vocab", c.vocab, 2, 4096);
  if (c.vocab < c.chunks * c.stride)
    throw Error(fmt::format(
        "--vocab must be at least --chunks x --stride = {} (a context's tokens are distinct), "
        "got {}",
        c.chunks * c.stride, c.vocab));
  check_range("kappa", c.kappa, 0.0, 10.0);
  check_range("epsilon", c.epsilon, 0.0, 0.5);
  check_range("gamma", c.gamma, 0.0, 1000.0);
  check_range("beta", c.beta, 0.0, 1000.0);
  check_range("rho", c.rho, 0.0, 100.0);
  check_range("contexts", c.contexts, 1, 1 << 20);
}

Embeddings make_embeddings(int n, double kappa, double epsilon, uint64_t seed) {
  Embeddings e;
  e.n = n;
  e.kappa = kappa;
  e.exact = epsilon == 0.0;
  if (e.exact) {
    e.dim = n + 1;  // coordinate 0 along u, coordinate a + 1 along f_a
    return e;
  }
  e.dim = n;
  const size_t nn = static_cast<size_t>(n) * n;
  e.gram.assign(nn, kappa);
  for (int a = 0; a < n; ++a) e.gram[static_cast<size_t>(a) * n + a] += 1.0;
  Rng rng(seed_for(seed, 0xe4b));
  for (int a = 0; a < n; ++a)
    for (int b = a; b < n; ++b) {
      const double d = epsilon * (2.0 * uniform01(rng) - 1.0);
      e.gram[static_cast<size_t>(a) * n + b] += d;
      if (b != a) e.gram[static_cast<size_t>(b) * n + a] += d;
    }
  // Cholesky: gram = L L^T, L lower triangular; row a of L is e_a.
  e.emb.assign(nn, 0.0);
  auto at = [&](std::vector<double>& v, int i, int j) -> double& {
    return v[static_cast<size_t>(i) * n + j];
  };
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      double s = at(e.gram, i, j);
      for (int k = 0; k < j; ++k) s -= at(e.emb, i, k) * at(e.emb, j, k);
      if (i != j) {
        at(e.emb, i, j) = s / at(e.emb, j, j);
      } else if (s > 1e-12) {
        at(e.emb, i, i) = std::sqrt(s);
      } else {
        throw Error(fmt::format(
            "--epsilon {} is too large for --vocab {}: the perturbed Gram matrix is not positive "
            "definite (keep epsilon well below 1 / sqrt(vocab))",
            epsilon, n));
      }
    }
  }
  return e;
}

void Embeddings::project(const double* c, double* theta) const {
  if (exact) {
    const double common = std::sqrt(kappa) * c[0];
    for (int a = 0; a < n; ++a) theta[a] = common + c[a + 1];
    return;
  }
  for (int a = 0; a < n; ++a) {
    const double* e = &emb[static_cast<size_t>(a) * n];
    double s = 0.0;
    for (int k = 0; k <= a; ++k) s += e[k] * c[k];  // lower triangular
    theta[a] = s;
  }
}

void Embeddings::project_adjoint(const double* dtheta, double* out) const {
  if (exact) {
    double sum = 0.0;
    for (int a = 0; a < n; ++a) {
      sum += dtheta[a];
      out[a + 1] += dtheta[a];
    }
    out[0] += std::sqrt(kappa) * sum;
    return;
  }
  for (int a = 0; a < n; ++a) {
    const double* e = &emb[static_cast<size_t>(a) * n];
    for (int k = 0; k <= a; ++k) out[k] += e[k] * dtheta[a];
  }
}

std::vector<Context> sample_contexts(int count, int chunks, int stride, int vocab, uint64_t seed) {
  const int len = chunks * stride;
  if (len > vocab) throw Error("sample_contexts: more context tokens than the vocabulary");
  std::vector<Context> out(static_cast<size_t>(count));
  std::vector<int> pool(static_cast<size_t>(vocab));
  for (int i = 0; i < count; ++i) {
    Rng rng(seed_for(seed, static_cast<uint64_t>(i)));
    for (int a = 0; a < vocab; ++a) pool[static_cast<size_t>(a)] = a;
    // Partial Fisher-Yates: the first `len` entries are a uniform draw without replacement.
    for (int k = 0; k < len; ++k)
      std::swap(pool[static_cast<size_t>(k)],
                pool[static_cast<size_t>(k + draw_below(rng, vocab - k))]);
    out[static_cast<size_t>(i)].assign(pool.begin(), pool.begin() + len);
  }
  return out;
}

int embedding_dim(const ModelConfig& c) { return c.epsilon == 0.0 ? c.vocab + 1 : c.vocab; }

size_t gate_index(const ModelConfig& c, int branch, int head, int r) {
  return (static_cast<size_t>(branch) * c.heads + head) * c.stride + r;
}

std::vector<double> random_start(const ModelConfig& c, uint64_t seed) {
  const size_t d = static_cast<size_t>(embedding_dim(c));
  const size_t gates = 2 * static_cast<size_t>(c.heads) * c.stride;
  std::vector<double> p(gates * d);
  Rng rng(seed_for(seed, 0x5747));
  for (size_t g = 0; g < gates; ++g) {
    double norm2 = 0.0;
    for (size_t k = 0; k < d; ++k) norm2 += (p[g * d + k] = normal(rng)) * p[g * d + k];
    const double scale = norm2 > 0.0 ? c.rho / std::sqrt(norm2) : 0.0;
    for (size_t k = 0; k < d; ++k) p[g * d + k] *= scale;
  }
  return p;
}

Model::Model(const ModelConfig& c) : cfg_(c) {
  validate(c);
  emb_ = make_embeddings(c.vocab, c.kappa, c.epsilon, c.seed);
}

size_t Model::n_params() const {
  return 2 * static_cast<size_t>(cfg_.heads) * cfg_.stride * emb_.dim;
}

std::vector<double> Model::gate_logits(const std::vector<double>& params) const {
  if (params.size() != n_params())
    throw Error(fmt::format("theory model: {} parameters given, {} expected", params.size(),
                            n_params()));
  const size_t gates = params.size() / emb_.dim, n = static_cast<size_t>(cfg_.vocab);
  std::vector<double> theta(gates * n);
  for (size_t g = 0; g < gates; ++g) emb_.project(&params[g * emb_.dim], &theta[g * n]);
  return theta;
}

namespace {

// One context through the model. With `dtheta`, adds the gradient of the summed loss over the
// context's queries to it; with `probe`, adds per-window gate statistics and per-query scores.
struct Pass {
  const ModelConfig& c;
  const Embeddings& e;
  const std::vector<double>& theta;

  size_t gidx(int b, int h, int l, int r) const {
    return ((static_cast<size_t>(b) * c.heads + h) * c.chunks + l) * c.stride + r;
  }

  // The logits z_j = beta sum_s W_s G(j, x_s) over all N tokens and, with `backward`, w.dw[s] =
  // dLoss/dW_s = beta sum_j (softmax(z)_j - [j == t]) G(j, x_s). Returns the query's loss.
  double logits_general(const Context& x, int t, int rs, Work& w, Model::Probe* probe,
                        bool backward) const {
    const int N = c.vocab, T = c.chunks * c.stride;
    std::fill(w.z.begin(), w.z.end(), 0.0);
    for (int s = 0; s < T; ++s) {
      const double ws = c.beta * w.w[s];
      const double* gs = &e.gram[static_cast<size_t>(x[s]) * N];
      for (int j = 0; j < N; ++j) w.z[j] += ws * gs[j];
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < N; ++j) mx = std::max(mx, w.z[j]);
    double sum = 0.0;
    for (int j = 0; j < N; ++j) sum += std::exp(w.z[j] - mx);
    const double lse = mx + std::log(sum);
    if (probe) {
      double other = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < N; ++j)
        if (j != t) other = std::max(other, w.z[j]);
      if (w.z[t] > other) probe->accuracy[rs] += 1.0;
      probe->target_prob[rs] += std::exp(w.z[t] - lse);
    }
    const double loss = lse - w.z[t];
    if (!backward) return loss;
    for (int j = 0; j < N; ++j) w.z[j] = std::exp(w.z[j] - lse);
    w.z[t] -= 1.0;
    for (int s = 0; s < T; ++s) {
      const double* gs = &e.gram[static_cast<size_t>(x[s]) * N];
      double d = 0.0;
      for (int j = 0; j < N; ++j) d += w.z[j] * gs[j];
      w.dw[s] = c.beta * d;
    }
    return loss;
  }

  // The same for G = I + kappa J exactly (epsilon = 0), in O(L S) instead of O(N L S): with
  // sum_s W_s = m', z_j = beta (W_j + kappa m') for a context token and beta kappa m' for the
  // N - L S others; the common beta kappa m' cancels in the softmax, and since sum_j dz_j = 0,
  // dLoss/dW_s = beta dz_{x_s}.
  double logits_exact(const Context& x, int t, int rs, Work& w, Model::Probe* probe,
                      bool backward) const {
    const int T = c.chunks * c.stride, rest = c.vocab - T;
    int ti = -1;
    double mx = rest > 0 ? 0.0 : -std::numeric_limits<double>::infinity();
    for (int s = 0; s < T; ++s) {
      w.z[s] = c.beta * w.w[s];
      mx = std::max(mx, w.z[s]);
      if (x[s] == t) ti = s;
    }
    double sum = rest > 0 ? rest * std::exp(-mx) : 0.0;
    for (int s = 0; s < T; ++s) sum += std::exp(w.z[s] - mx);
    const double lse = mx + std::log(sum);
    if (probe) {
      double other = rest > 0 ? 0.0 : -std::numeric_limits<double>::infinity();
      for (int s = 0; s < T; ++s)
        if (s != ti) other = std::max(other, w.z[s]);
      if (w.z[ti] > other) probe->accuracy[rs] += 1.0;
      probe->target_prob[rs] += std::exp(w.z[ti] - lse);
    }
    const double loss = lse - w.z[ti];
    if (!backward) return loss;
    for (int s = 0; s < T; ++s) w.dw[s] = c.beta * (std::exp(w.z[s] - lse) - (s == ti ? 1.0 : 0.0));
    return loss;
  }

  double run(const Context& x, Work& w, std::vector<double>* dtheta, Model::Probe* probe) const {
    const int m = c.heads, S = c.stride, L = c.chunks, N = c.vocab, T = L * S;
    w.gate.assign(2 * static_cast<size_t>(m) * T, 0.0);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < m; ++h)
        for (int l = 0; l < L; ++l) {
          double* p = &w.gate[gidx(b, h, l, 0)];
          for (int r = 0; r < S; ++r)
            p[r] = theta[gate_index(c, b, h, r) * N + static_cast<size_t>(x[l * S + r])];
          softmax(p, S);
          if (probe) {
            for (int r = 0; r < S; ++r) probe->mean_gate[b][h][r] += p[r];
            probe->window_eff[b][h] += exp_entropy(p, S);
            probe->window_max[b][h] += *std::max_element(p, p + S);
          }
        }
    if (dtheta) w.dgate.assign(w.gate.size(), 0.0);
    w.alpha.resize(static_cast<size_t>(m) * L);
    w.dalpha.resize(w.alpha.size());
    w.w.resize(static_cast<size_t>(T));
    w.dw.resize(static_cast<size_t>(T));
    w.z.resize(static_cast<size_t>(N));
    double total = 0.0;
    for (int ls = 0; ls < L; ++ls)
      for (int rs = 0; rs + 1 < S; ++rs) {
        const int q = x[ls * S + rs], t = x[ls * S + rs + 1];
        // Attention of every head over the chunks.
        for (int h = 0; h < m; ++h) {
          double* a = &w.alpha[static_cast<size_t>(h) * L];
          for (int l = 0; l < L; ++l) {
            const double* pk = &w.gate[gidx(0, h, l, 0)];
            double s = 0.0;
            for (int r = 0; r < S; ++r) s += pk[r] * e.g(q, x[l * S + r]);
            a[l] = c.gamma * s;
          }
          softmax(a, L);
        }
        // Weight of every context token in the output, then the logits.
        for (int l = 0; l < L; ++l)
          for (int r = 0; r < S; ++r) {
            double s = 0.0;
            for (int h = 0; h < m; ++h)
              s += w.alpha[static_cast<size_t>(h) * L + l] * w.gate[gidx(1, h, l, r)];
            w.w[l * S + r] = s;
          }
        total += c.epsilon == 0.0 ? logits_exact(x, t, rs, w, probe, dtheta != nullptr)
                                  : logits_general(x, t, rs, w, probe, dtheta != nullptr);
        if (!dtheta) continue;
        for (int h = 0; h < m; ++h) {
          const double* a = &w.alpha[static_cast<size_t>(h) * L];
          double* da = &w.dalpha[static_cast<size_t>(h) * L];
          double dot = 0.0;
          for (int l = 0; l < L; ++l) {
            const double* pv = &w.gate[gidx(1, h, l, 0)];
            double* dpv = &w.dgate[gidx(1, h, l, 0)];
            double d = 0.0;
            for (int r = 0; r < S; ++r) {
              d += pv[r] * w.dw[l * S + r];
              dpv[r] += a[l] * w.dw[l * S + r];
            }
            da[l] = d;
            dot += a[l] * d;
          }
          for (int l = 0; l < L; ++l) {
            const double ds = a[l] * (da[l] - dot);  // through the softmax over chunks
            double* dpk = &w.dgate[gidx(0, h, l, 0)];
            for (int r = 0; r < S; ++r) dpk[r] += c.gamma * ds * e.g(q, x[l * S + r]);
          }
        }
      }
    if (dtheta) {
      // Through the softmax over positions into the gate logits theta_{h,r,x_{l,r}}.
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < m; ++h)
          for (int l = 0; l < L; ++l) {
            const double* p = &w.gate[gidx(b, h, l, 0)];
            const double* dp = &w.dgate[gidx(b, h, l, 0)];
            double dot = 0.0;
            for (int r = 0; r < S; ++r) dot += p[r] * dp[r];
            for (int r = 0; r < S; ++r)
              (*dtheta)[gate_index(c, b, h, r) * N + static_cast<size_t>(x[l * S + r])] +=
                  p[r] * (dp[r] - dot);
          }
    }
    return total;
  }
};

}  // namespace

double Model::loss_and_grad(const std::vector<double>& params, const std::vector<Context>& sample,
                            std::vector<double>* grad) const {
  if (sample.empty()) throw Error("theory model: empty sample");
  const std::vector<double> theta = gate_logits(params);
  std::vector<double> dtheta;
  if (grad) dtheta.assign(theta.size(), 0.0);
  const Pass pass{cfg_, emb_, theta};
  Work w;
  double total = 0.0;
  for (const Context& x : sample) total += pass.run(x, w, grad ? &dtheta : nullptr, nullptr);
  const double scale =
      1.0 / (static_cast<double>(sample.size()) * cfg_.chunks * (cfg_.stride - 1));
  if (grad) {
    // c enters only through theta_a = <c, e_a>: dL/dc = sum_a dL/dtheta_a e_a.
    const size_t n = static_cast<size_t>(cfg_.vocab), d = static_cast<size_t>(emb_.dim);
    for (double& v : dtheta) v *= scale;
    grad->assign(params.size(), 0.0);
    for (size_t g = 0; g < params.size() / d; ++g)
      emb_.project_adjoint(&dtheta[g * n], &(*grad)[g * d]);
  }
  return total * scale;
}

Model::Probe Model::probe(const std::vector<double>& params,
                          const std::vector<Context>& sample) const {
  if (sample.empty()) throw Error("theory model: empty sample");
  const int m = cfg_.heads, S = cfg_.stride;
  Probe p;
  p.mean_gate.assign(2, std::vector<std::vector<double>>(m, std::vector<double>(S, 0.0)));
  p.static_eff.assign(2, std::vector<double>(m, 0.0));
  p.window_eff = p.static_eff;
  p.window_max = p.static_eff;
  p.accuracy.assign(static_cast<size_t>(S - 1), 0.0);
  p.target_prob = p.accuracy;
  const std::vector<double> theta = gate_logits(params);
  const Pass pass{cfg_, emb_, theta};
  Work w;
  double total = 0.0;
  for (const Context& x : sample) total += pass.run(x, w, nullptr, &p);
  const double windows = static_cast<double>(sample.size()) * cfg_.chunks;
  p.queries_per_position = static_cast<int64_t>(sample.size()) * cfg_.chunks;
  p.loss = total / (windows * (S - 1));
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < m; ++h) {
      for (double& v : p.mean_gate[b][h]) v /= windows;
      p.static_eff[b][h] = exp_entropy(p.mean_gate[b][h].data(), S);
      p.window_eff[b][h] /= windows;
      p.window_max[b][h] /= windows;
    }
  for (int r = 0; r + 1 < S; ++r) {
    p.accuracy[r] /= windows;
    p.target_prob[r] /= windows;
  }
  return p;
}

double uniform_gate_loss(const ModelConfig& c) {
  if (c.epsilon != 0.0) throw Error("uniform_gate_loss: only for epsilon = 0");
  const double S = c.stride, L = c.chunks, m = c.heads;
  const double e = std::exp(c.gamma / S);
  const double alpha = e / (e + L - 1.0);           // attention on the query's chunk
  const double w_own = m * alpha / S;               // weight of each token of that chunk
  const double w_other = c.chunks > 1 ? m * (1.0 - alpha) / ((L - 1.0) * S) : 0.0;
  // z_j = beta (w_j + kappa m); the common kappa m cancels in the softmax.
  const double denom = S * std::exp(c.beta * w_own) + (L - 1.0) * S * std::exp(c.beta * w_other) +
                       (c.vocab - L * S);
  return -c.beta * w_own + std::log(denom);
}

}  // namespace phasekv::theory
