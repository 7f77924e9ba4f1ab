// The attention core of the streaming session (AttentionImpl::forward_cached): the newest tokens'
// queries against the keys a LayerCache holds. Same contract and results as attend_reference,
// without its [Tq, E + R] visibility masks:
//
//  - one query (decode): every cached key is visible to the newest token (the cache keeps exactly
//    the entries and raw tokens it can see, model/visibility.h), so there is no mask at all, and
//    the scores go into the cache's reusable Scratch: a decode step allocates nothing whose size
//    depends on the context;
//  - several queries (prefill chunks): the queries are cut into blocks of rows; each block
//    multiplies only against the keys one of its rows can see, and only the columns some rows
//    see and others do not ("ragged" columns: the last entries, the window's first and last
//    tokens) are masked. Blocks are sized so that their scores stay below a few MB.
//
// Both rely on visibility being an interval per query t (visibility.h): entries [0, (t+1)/S),
// raw tokens [raw_keep_from(a, t), t], with both ends non-decreasing in t.
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"
#include "model/seq_buffer.h"

namespace phasekv {

// The keys of one streaming layer: entries 0..E-1 and raw tokens at the consecutive positions
// r0 .. r0+R-1 (both [B, Hkv, n, hd]; a pair may be undefined or empty).
struct CachedKeys {
  torch::Tensor ek, ev, rk, rv;
  int64_t r0 = 0;
};

// q: [B, H, Tq, hd] (rotated) at positions t0 .. t0+Tq-1, the raw keys ending at the last query
// (r0 + R = t0 + Tq when R > 0); sink: [H] or undefined. Returns [B, H, Tq, hd]; a query that sees
// nothing gets 0.
torch::Tensor attend_cached(const AttentionConfig& a, const torch::Tensor& q, int64_t t0,
                            const CachedKeys& keys, const torch::Tensor& sink, Scratch& scratch);

}  // namespace phasekv
