// One thread count for all of a process's compute: libtorch's pool and the system BLAS's own.
#pragma once

namespace phasekv::kernels {

// at::set_num_threads(n), and the same count for OpenBLAS when libtorch calls it (Debian's
// libtorch uses the system BLAS, libopenblas0-pthread). OpenBLAS keeps its own pool of one
// thread per core whatever libtorch is told, and its idle workers spin in sched_yield: two
// one-thread training jobs on 2 cores ran 4 busy threads, and the job whose products reached
// OpenBLAS fell to a tenth of its speed. A no-op for OpenBLAS when another BLAS is loaded.
void set_compute_threads(int n);

}  // namespace phasekv::kernels
