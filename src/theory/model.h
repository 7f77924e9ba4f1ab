// The study's idealised model of chunked compression (docs/THEORY.md, PAPER.md section 3,
// "Theory"), small enough to integrate its gradient flow exactly in double precision.
//
// A context is L chunks of S tokens, all L*S distinct, drawn uniformly from N tokens whose
// embeddings e_a are nearly equiangular: <e_a, e_b> = kappa + [a == b] + Delta_ab, |Delta_ab| <=
// epsilon. m heads compress every chunk l with query-independent, log-linear gates
//   p^K_{h,l}(r) = softmax_r <c^K_{h,r}, e_{x_{l,r}}>,   p^V likewise with c^V,
//   k_{h,l} = sum_r p^K_{h,l}(r) e_{x_{l,r}},           v_{h,l} = sum_r p^V_{h,l}(r) e_{x_{l,r}}.
// A query is the embedding of the token at a non-final position r* < S-1 of chunk l*; each head
// attends over the L chunks, alpha_{h,l} = softmax_l(gamma <e_q, k_{h,l}>); the summed output
// o = sum_{h,l} alpha_{h,l} v_{h,l} is unembedded, z_j = beta <e_j, o>, and the loss is the
// cross-entropy of the successor x_{l*, r*+1}. The parameters are the 2 m S gate vectors c.
//
// Torch-free and analytic: loss_and_grad returns the exact gradient of the sample loss, checked
// against finite differences in tests/test_theory.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace phasekv::theory {

// Every field has the name of the `phasekv theory` flag that sets it (underscores as dashes).
struct ModelConfig {
  int heads = 3;          // m
  int stride = 4;         // S, tokens per chunk
  int chunks = 4;         // L
  int vocab = 128;        // N; needs N >= L*S (all context tokens distinct)
  double kappa = 1.0;     // inner product of distinct embeddings
  double epsilon = 0.0;   // bound on the deviation of the Gram matrix from kappa J + I
  double gamma = 8.0;     // attention scale over chunks
  double beta = 2.0;      // unembedding scale
  double rho = 0.05;      // radius of every gate vector c at the start
  int contexts = 128;     // the fixed Monte Carlo sample of contexts the loss averages over
  uint64_t seed = 1;      // embeddings (Delta), start and samples
};

// Throws phasekv::Error naming the flag and its allowed range.
void validate(const ModelConfig& c);

// Nearly equiangular embeddings in R^dim. With epsilon = 0 they are exact and structured:
// e_a = sqrt(kappa) u + f_a with u, f_1..f_N orthonormal (dim = N + 1), so <c, e_a> costs O(1).
// With epsilon > 0, gram = I + kappa J + Delta (Delta symmetric, entries uniform in
// [-epsilon, epsilon], drawn from `seed`) and e_a is row a of its lower Cholesky factor
// (dim = N); throws when gram is not positive definite (epsilon too large for N).
struct Embeddings {
  int n = 0, dim = 0;
  double kappa = 0.0;
  bool exact = true;
  std::vector<double> gram;  // n x n, row-major; empty when exact
  std::vector<double> emb;   // n x dim, row-major; empty when exact
  double g(int a, int b) const {
    return exact ? kappa + (a == b ? 1.0 : 0.0) : gram[static_cast<size_t>(a) * n + b];
  }
  // theta[a] = <c, e_a> for every token, and its adjoint out += sum_a dtheta[a] e_a.
  void project(const double* c, double* theta) const;
  void project_adjoint(const double* dtheta, double* out) const;
};
Embeddings make_embeddings(int n, double kappa, double epsilon, uint64_t seed);

// Contexts of L*S distinct tokens, token (l, r) at l*S + r.
using Context = std::vector<int>;
std::vector<Context> sample_contexts(int count, int chunks, int stride, int vocab, uint64_t seed);

// The dimension of the embeddings and gate vectors: N + 1 when epsilon = 0, else N.
int embedding_dim(const ModelConfig& c);
// The parameter vector: gate vector c^B_{h,r} in R^dim (branch B = 0 key, 1 value) at
// gate_index(c, B, h, r) * dim; its logits theta^B_{h,r,.} in R^N at gate_index(...) * N.
size_t gate_index(const ModelConfig& c, int branch, int head, int r);
// Every gate vector uniformly on the sphere of radius rho.
std::vector<double> random_start(const ModelConfig& c, uint64_t seed);

class Model {
 public:
  explicit Model(const ModelConfig& c);  // validates and builds the embeddings
  const ModelConfig& config() const { return cfg_; }
  const Embeddings& embeddings() const { return emb_; }
  size_t n_params() const;

  // Gate logits theta^B_{h,r,a} = <c^B_{h,r}, e_a> for every token a.
  std::vector<double> gate_logits(const std::vector<double>& params) const;

  // Mean cross-entropy over every context of `sample` and every query (l*, r*), r* in [0, S-1);
  // with `grad` (resized to n_params()), its exact gradient with respect to the parameters.
  double loss_and_grad(const std::vector<double>& params, const std::vector<Context>& sample,
                       std::vector<double>* grad) const;

  // What a trajectory records on a sample.
  struct Probe {
    double loss = 0.0;
    // [branch][head][r]: mean gate weight over the sample's windows (the static profile).
    std::vector<std::vector<std::vector<double>>> mean_gate;
    // [branch][head]: exp(entropy) of the static profile and mean exp(entropy) per window, both
    // in [1, S] (the two concentration measures of `phasekv gates`).
    std::vector<std::vector<double>> static_eff, window_eff;
    // [branch][head]: mean over windows of the gate's largest weight.
    std::vector<std::vector<double>> window_max;
    // [r*], r* in [0, S-1): top-1 accuracy of the successor (the target's logit strictly above
    // every other token's) and the mean probability given to it.
    std::vector<double> accuracy, target_prob;
    int64_t queries_per_position = 0;
  };
  Probe probe(const std::vector<double>& params, const std::vector<Context>& sample) const;

 private:
  ModelConfig cfg_;
  Embeddings emb_;
};

// Closed form of the population loss when every gate is uniform (c = 0) and epsilon = 0: every
// context then gives the same loss, so any sample's mean equals it exactly (a test of the sample
// loss and of the claim that the Monte Carlo sample is exact for position-only gates).
double uniform_gate_loss(const ModelConfig& c);

}  // namespace phasekv::theory
