/* The OpenMPI peer of allreduce_shm_bench: MPI_Allreduce of float32 SUM over MPI_COMM_WORLD.
 *
 *   mpirun --oversubscribe --allow-run-as-root -n 4 ./mpi_allreduce [-r REPS] [-t TARGET_MS] [SIZE...]
 *
 * SIZE: bytes per rank (default: 4 64 1K 4K 16K 64K 256K 1M 4M 16M 64M; a K or M suffix is allowed).
 * Per size: the result is checked once (rank r contributes r+1 everywhere; every element must be
 * n(n+1)/2), a few warm-up calls, then the number of calls per repetition is calibrated (on
 * rank 0, broadcast) so one repetition lasts about TARGET_MS (default 5). Each repetition: a
 * barrier, ITERS calls, each rank's time per call, MPI_Reduce(MAX) to rank 0 = the slowest rank.
 * Rank 0 prints one line per size, median and min over REPS (default 5) repetitions:
 *
 *   mpi_allreduce bytes=<B> ranks=<N> iters=<I> reps=<R> median_us=<T> min_us=<T>
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static long parse_size(const char* s) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || v <= 0) return -1;
  if (*end == 'K' || *end == 'k') {
    v <<= 10;
    ++end;
  } else if (*end == 'M' || *end == 'm') {
    v <<= 20;
    ++end;
  }
  return *end == '\0' ? v : -1;
}

/* Seconds per call of the slowest rank (valid on rank 0). */
static double timed(const float* in, float* out, int count, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double mine = (MPI_Wtime() - t0) / iters;
  double slowest = 0.0;
  MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  static const long defaults[] = {4, 64, 1L << 10, 4L << 10, 16L << 10, 64L << 10,
                                  256L << 10, 1L << 20, 4L << 20, 16L << 20, 64L << 20};
  long sizes[64];
  int nsizes = 0, reps = 5;
  double target_ms = 5.0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
    } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
      target_ms = atof(argv[++i]);
    } else {
      const long v = parse_size(argv[i]);
      if (v < 0 || nsizes == 64) {
        if (rank == 0) fprintf(stderr, "mpi_allreduce: bad argument '%s'\n", argv[i]);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      sizes[nsizes++] = v;
    }
  }
  if (nsizes == 0) {
    nsizes = (int)(sizeof defaults / sizeof defaults[0]);
    memcpy(sizes, defaults, sizeof defaults);
  }
  if (reps < 1) reps = 1;

  double* samples = malloc(sizeof(double) * (size_t)reps);
  for (int s = 0; s < nsizes; ++s) {
    const long bytes = sizes[s];
    const int count = bytes / 4 > 0 ? (int)(bytes / 4) : 1;
    float* in = malloc(sizeof(float) * (size_t)count);
    float* out = malloc(sizeof(float) * (size_t)count);
    for (int i = 0; i < count; ++i) in[i] = (float)(rank + 1);

    /* The check, once. */
    MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const float expected = (float)(size * (size + 1) / 2);
    int bad = -1;
    for (int i = 0; i < count && bad < 0; ++i)
      if (out[i] != expected) bad = i;
    int any_bad = 0, mine_bad = bad >= 0;
    MPI_Allreduce(&mine_bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (any_bad) {
      if (bad >= 0) fprintf(stderr, "mpi_allreduce: rank %d, %ld bytes: element %d is %g, expected %g\n", rank, bytes,
                            bad, out[bad], expected);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* Warm-up, then calibrate the calls per repetition on rank 0. */
    const int probe = bytes >= (4L << 20) ? 1 : 8;
    timed(in, out, count, probe);
    double guess = timed(in, out, count, probe);
    int iters = 1;
    if (rank == 0) {
      double n = target_ms * 1e-3 / (guess > 1e-9 ? guess : 1e-9);
      iters = n < 1 ? 1 : (n > 100000 ? 100000 : (int)n);
    }
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);

    for (int r = 0; r < reps; ++r) samples[r] = timed(in, out, count, iters);
    if (rank == 0) {
      qsort(samples, (size_t)reps, sizeof(double), cmp_double);
      const double median =
          reps % 2 ? samples[reps / 2] : 0.5 * (samples[reps / 2 - 1] + samples[reps / 2]);
      printf("mpi_allreduce bytes=%ld ranks=%d iters=%d reps=%d median_us=%.3f min_us=%.3f\n", bytes, size, iters,
             reps, median * 1e6, samples[0] * 1e6);
      fflush(stdout);
    }
    free(in);
    free(out);
  }
  free(samples);
  MPI_Finalize();
  return 0;
}
