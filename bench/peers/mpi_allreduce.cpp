// Open MPI peer for bench_allreduce: one collective between the ranks of one mpirun, on Open
// MPI's shared-memory transport when bench_allreduce starts it (`--op`: allreduce, f32 sum in
// place; reduce_scatter, MPI_Reduce_scatter_block of the whole buffer into a chunk of its own;
// allgather, in place; broadcast from rank 0). For each size (the whole buffer, in bytes): a
// warm-up call, then batches of calls until --min-seconds has passed, --reps times; rank 0
// prints one JSON line
// {"sizes": [bytes...], "seconds": [median seconds per call...], "library": "...", "call": "..."}.
// Built by bench/CMakeLists.txt where MPI is found (scripts/bootstrap.sh installs Open MPI).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<size_t> sizes;
  double min_seconds = 0.3;
  int reps = 5;
  std::string op = "allreduce";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--op") {
      op = argv[i + 1];
    } else if (flag == "--sizes") {
      for (char* p = std::strtok(argv[i + 1], ","); p; p = std::strtok(nullptr, ",")) {
        sizes.push_back(std::strtoull(p, nullptr, 10));
      }
    } else if (flag == "--min-seconds") {
      min_seconds = std::atof(argv[i + 1]);
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    }
  }
  if (op != "allreduce" && op != "reduce_scatter" && op != "allgather" && op != "broadcast") {
    if (rank == 0) std::fprintf(stderr, "mpi_allreduce_peer: --op %s: unknown\n", op.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::vector<double> seconds;
  for (const size_t bytes : sizes) {
    std::vector<float> buf(bytes / sizeof(float), static_cast<float>(rank + 1));
    const int n = static_cast<int>(buf.size());
    const int chunk = n / size;
    std::vector<float> mine(static_cast<size_t>(chunk));
    auto call = [&] {
      if (op == "reduce_scatter") {
        MPI_Reduce_scatter_block(buf.data(), mine.data(), chunk, MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD);
      } else if (op == "allgather") {
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data(), chunk, MPI_FLOAT,
                      MPI_COMM_WORLD);
      } else if (op == "broadcast") {
        MPI_Bcast(buf.data(), n, MPI_FLOAT, 0, MPI_COMM_WORLD);
      } else {
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
    };
    call();
    // Calls per batch, agreed by every rank (rank 0's estimate).
    int64_t iters = 1;
    for (;; iters *= 2) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int64_t k = 0; k < iters; ++k) call();
      int enough = MPI_Wtime() - t0 >= min_seconds / 4 || iters >= (1 << 16);
      MPI_Bcast(&enough, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (enough) break;
    }
    iters *= 4;
    std::vector<double> per_call;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int64_t k = 0; k < iters; ++k) call();
      per_call.push_back((MPI_Wtime() - t0) / static_cast<double>(iters));
    }
    seconds.push_back(median(per_call));
  }
  if (rank == 0) {
    char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(library, &length);
    std::string first_line(library, strcspn(library, ",\n"));
    const char* call = op == "reduce_scatter" ? "MPI_Reduce_scatter_block f32 sum"
                       : op == "allgather"    ? "MPI_Allgather f32 in place"
                       : op == "broadcast"    ? "MPI_Bcast f32 from rank 0"
                                              : "MPI_Allreduce f32 sum in place";
    std::printf("{\"library\": \"%s\", \"call\": \"%s\", \"ranks\": %d, \"sizes\": [",
                first_line.c_str(), call, size);
    for (size_t i = 0; i < sizes.size(); ++i) std::printf("%s%zu", i ? ", " : "", sizes[i]);
    std::printf("], \"seconds\": [");
    for (size_t i = 0; i < seconds.size(); ++i) std::printf("%s%.9g", i ? ", " : "", seconds[i]);
    std::printf("]}\n");
  }
  MPI_Finalize();
  return 0;
}
