/* An ordinary CUDA + MPI program that knows nothing of zcomm: it calls the collectives that
 * libzcomm_mpi.so intercepts on CUDA device buffers (cudaMalloc) and on managed buffers
 * (cudaMallocManaged), checks every result against a host reference, and times them.
 *
 *   pmpi_device TOL [--time N ITERS] [--stage-self] [--mixed] [--label L]
 *
 * TOL: the largest absolute error accepted (the E of ZCOMM_ERROR_BOUND=abs:E; 0 without the
 * library, up to float rounding). Checks run on 200003-element buffers:
 *   allreduce f32, allreduce f64 in place, allreduce double complex, reduce_scatter_block f32,
 *   reduce_scatter_block f64 in place, allgather f32, allgather f64 in place, bcast f64,
 *   allreduce f32 on managed memory; point to point on device buffers: MPI_Sendrecv ring f32,
 *   MPI_Send/MPI_Recv f64 (rank 0 to 1), MPI_Isend/MPI_Irecv/MPI_Waitall ring double complex,
 *   a small MPI_Send/MPI_Recv (below ZCOMM_MIN_BYTES: exact).
 * --mixed: rank 0 passes managed buffers and the other ranks host buffers to one allreduce (the
 *   library must agree to pass it through; managed memory works with any MPI): exact result.
 * --stage-self: the program copies device buffers to the host itself and calls MPI on host
 *   memory (what a program does with an MPI that is not CUDA-aware): the raw baseline.
 * --time N ITERS: then time allreduce / reduce_scatter_block / allgather / bcast of N f32 per
 *   rank on device buffers, and a MPI_Sendrecv ring of N f32 (one warm-up, best and median of ITERS, barrier before each, the
 *   slowest rank), and print one line per operation: "time LABEL OP BYTES BEST_MS MEDIAN_MS".
 *
 * Prints "ok"/"FAIL" lines on rank 0 and exits 1 on failure. Build:
 *   mpicc -O2 -o pmpi_device pmpi_device.c -I$CUDA/include -L$CUDA/lib64 -lcudart -lm */
#include <complex.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, failed = 0, stage_self = 0;
static double tol;

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #x, cudaGetErrorString(e_));            \
            MPI_Abort(MPI_COMM_WORLD, 3);                                                      \
        }                                                                                      \
    } while (0)

static double field(int r, long i) { return sin(1e-4 * (double)i + 0.7 * r) + 0.25 * cos(3e-5 * (double)i * (r + 1)); }

static void report(const char *name, double err, double limit) {
    double all;
    MPI_Allreduce(&err, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int bad = !(all <= limit);
    if (rank == 0) printf("%s %-40s max_err %.3e (limit %.3e)\n", bad ? "FAIL" : "ok  ", name, all, limit);
    if (bad) failed = 1;
}

static double lim_f32(void) { return tol + 4.0 * size * 6e-8 * (size + 1); }
static double lim_f64(void) { return tol + 1e-12; }

static void *dalloc(size_t bytes) {
    void *p;
    CK(cudaMalloc(&p, bytes));
    return p;
}
static void h2d(void *d, const void *h, size_t b) { CK(cudaMemcpy(d, h, b, cudaMemcpyHostToDevice)); }
static void d2h(void *h, const void *d, size_t b) { CK(cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost)); }

/* The collectives on device buffers: directly (the library, or a CUDA-aware MPI) or, with
 * --stage-self, through host copies made by the program. */
static void allreduce(const void *s, void *r, int n, MPI_Datatype t, size_t es) {
    if (!stage_self) {
        MPI_Allreduce(s, r, n, t, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
    void *h = malloc(n * es);
    d2h(h, s == MPI_IN_PLACE ? r : s, n * es);
    MPI_Allreduce(MPI_IN_PLACE, h, n, t, MPI_SUM, MPI_COMM_WORLD);
    h2d(r, h, n * es);
    free(h);
}
static void reduce_scatter(const void *s, void *r, int rc, MPI_Datatype t, size_t es) {
    if (!stage_self) {
        MPI_Reduce_scatter_block(s, r, rc, t, MPI_SUM, MPI_COMM_WORLD);
        return;
    }
    void *h = malloc((size_t)rc * size * es), *o = malloc(rc * es);
    d2h(h, s == MPI_IN_PLACE ? r : s, (size_t)rc * size * es);
    MPI_Reduce_scatter_block(h, o, rc, t, MPI_SUM, MPI_COMM_WORLD);
    h2d(r, o, rc * es);
    free(h);
    free(o);
}
static void allgather(const void *s, void *r, int n, MPI_Datatype t, size_t es) {
    if (!stage_self) {
        MPI_Allgather(s, n, t, r, n, t, MPI_COMM_WORLD);
        return;
    }
    void *h = malloc((size_t)n * size * es);
    d2h((char *)h + (size_t)rank * n * es, s == MPI_IN_PLACE ? (char *)r + (size_t)rank * n * es : s, n * es);
    MPI_Allgather(MPI_IN_PLACE, n, t, h, n, t, MPI_COMM_WORLD);
    h2d(r, h, (size_t)n * size * es);
    free(h);
}
static void bcast(void *b, int n, MPI_Datatype t, size_t es, int root) {
    if (!stage_self) {
        MPI_Bcast(b, n, t, root, MPI_COMM_WORLD);
        return;
    }
    void *h = malloc(n * es);
    if (rank == root) d2h(h, b, n * es);
    MPI_Bcast(h, n, t, root, MPI_COMM_WORLD);
    h2d(b, h, n * es);
    free(h);
}

/* point to point on device buffers, or with --stage-self through host copies */
static void sendrecv(const void *s, int dest, void *r, int src, int n, MPI_Datatype t, size_t es) {
    if (!stage_self) {
        MPI_Sendrecv(s, n, t, dest, 7, r, n, t, src, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        return;
    }
    void *hs = malloc(n * es), *hr = malloc(n * es);
    d2h(hs, s, n * es);
    MPI_Sendrecv(hs, n, t, dest, 7, hr, n, t, src, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    h2d(r, hr, n * es);
    free(hs);
    free(hr);
}
static void send(const void *s, int n, MPI_Datatype t, size_t es, int dest) {
    if (!stage_self) {
        MPI_Send(s, n, t, dest, 8, MPI_COMM_WORLD);
        return;
    }
    void *h = malloc(n * es);
    d2h(h, s, n * es);
    MPI_Send(h, n, t, dest, 8, MPI_COMM_WORLD);
    free(h);
}
static int recv(void *r, int n, MPI_Datatype t, size_t es, int src) {
    MPI_Status st;
    int got = -1;
    if (!stage_self) {
        MPI_Recv(r, n, t, src, 8, MPI_COMM_WORLD, &st);
    } else {
        void *h = malloc(n * es);
        MPI_Recv(h, n, t, src, 8, MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, t, &got);
        h2d(r, h, got * es); /* what arrived: the rest of the receive buffer stays as it was */
        free(h);
    }
    MPI_Get_count(&st, t, &got);
    return got;
}
static void isend_irecv(const void *s, int dest, void *r, int src, int n, MPI_Datatype t, size_t es) {
    MPI_Request q[2];
    void *hs = (void *)s, *hr = r;
    if (stage_self) {
        hs = malloc(n * es);
        hr = malloc(n * es);
        d2h(hs, s, n * es);
    }
    MPI_Irecv(hr, n, t, src, 9, MPI_COMM_WORLD, &q[0]);
    MPI_Isend(hs, n, t, dest, 9, MPI_COMM_WORLD, &q[1]);
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
    if (stage_self) {
        h2d(r, hr, n * es);
        free(hs);
        free(hr);
    }
}

static void checks(void) {
    const long n = 200003;
    const int rc = 100003;
    float *hf = malloc(n * size * sizeof(float)), *of = malloc(n * size * sizeof(float));
    double *hd = malloc(n * size * sizeof(double)), *od = malloc(n * size * sizeof(double));
    double complex *hc = malloc(n * sizeof(double complex)), *oc = malloc(n * sizeof(double complex));
    float *df = dalloc(n * size * sizeof(float)), *dfo = dalloc(n * size * sizeof(float));
    double *dd = dalloc(n * size * sizeof(double));
    double complex *dc = dalloc(n * sizeof(double complex)), *dco = dalloc(n * sizeof(double complex));
    double e;

    /* allreduce f32 */
    for (long i = 0; i < n; i++) hf[i] = (float)field(rank, i);
    h2d(df, hf, n * sizeof(float));
    allreduce(df, dfo, n, MPI_FLOAT, sizeof(float));
    d2h(of, dfo, n * sizeof(float));
    e = 0;
    for (long i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (float)field(r, i);
        e = fmax(e, fabs(of[i] - want));
    }
    report("device allreduce f32", e, lim_f32());

    /* allreduce f64 in place */
    for (long i = 0; i < n; i++) hd[i] = field(rank, i);
    h2d(dd, hd, n * sizeof(double));
    allreduce(MPI_IN_PLACE, dd, n, MPI_DOUBLE, sizeof(double));
    d2h(od, dd, n * sizeof(double));
    e = 0;
    for (long i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += field(r, i);
        e = fmax(e, fabs(od[i] - want));
    }
    report("device allreduce f64 in place", e, lim_f64());

    /* allreduce double complex */
    for (long i = 0; i < n; i++) hc[i] = field(rank, i) + I * field(rank + 3, i);
    h2d(dc, hc, n * sizeof(double complex));
    allreduce(dc, dco, n, MPI_C_DOUBLE_COMPLEX, sizeof(double complex));
    d2h(oc, dco, n * sizeof(double complex));
    e = 0;
    for (long i = 0; i < n; i++) {
        double complex want = 0;
        for (int r = 0; r < size; r++) want += field(r, i) + I * field(r + 3, i);
        e = fmax(e, fmax(fabs(creal(oc[i]) - creal(want)), fabs(cimag(oc[i]) - cimag(want))));
    }
    report("device allreduce double complex", e, lim_f64());

    /* reduce_scatter_block f32 */
    for (long i = 0; i < (long)rc * size; i++) hf[i] = (float)field(rank, i);
    h2d(df, hf, (size_t)rc * size * sizeof(float));
    reduce_scatter(df, dfo, rc, MPI_FLOAT, sizeof(float));
    d2h(of, dfo, rc * sizeof(float));
    e = 0;
    for (long i = 0; i < rc; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (float)field(r, (long)rank * rc + i);
        e = fmax(e, fabs(of[i] - want));
    }
    report("device reduce_scatter_block f32", e, lim_f32());

    /* reduce_scatter_block f64 in place */
    for (long i = 0; i < (long)rc * size; i++) hd[i] = field(rank, i);
    h2d(dd, hd, (size_t)rc * size * sizeof(double));
    reduce_scatter(MPI_IN_PLACE, dd, rc, MPI_DOUBLE, sizeof(double));
    d2h(od, dd, rc * sizeof(double));
    e = 0;
    for (long i = 0; i < rc; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += field(r, (long)rank * rc + i);
        e = fmax(e, fabs(od[i] - want));
    }
    report("device reduce_scatter_block f64 in place", e, lim_f64());

    /* allgather f32 */
    for (long i = 0; i < n; i++) hf[i] = (float)field(rank, i);
    h2d(df, hf, n * sizeof(float));
    allgather(df, dfo, n, MPI_FLOAT, sizeof(float));
    d2h(of, dfo, (size_t)n * size * sizeof(float));
    e = 0;
    for (int r = 0; r < size; r++)
        for (long i = 0; i < n; i++) e = fmax(e, fabs(of[(size_t)r * n + i] - (float)field(r, i)));
    report("device allgather f32", e, tol + 1e-7);

    /* allgather f64 in place */
    for (long i = 0; i < n; i++) hd[(size_t)rank * n + i] = field(rank, i);
    h2d(dd + (size_t)rank * n, hd + (size_t)rank * n, n * sizeof(double));
    allgather(MPI_IN_PLACE, dd, n, MPI_DOUBLE, sizeof(double));
    d2h(od, dd, (size_t)n * size * sizeof(double));
    e = 0;
    for (int r = 0; r < size; r++)
        for (long i = 0; i < n; i++) e = fmax(e, fabs(od[(size_t)r * n + i] - field(r, i)));
    report("device allgather f64 in place", e, lim_f64());

    /* bcast f64 */
    int root = 1 % size;
    for (long i = 0; i < n; i++) hd[i] = rank == root ? field(root, i) : -1.0;
    h2d(dd, hd, n * sizeof(double));
    bcast(dd, n, MPI_DOUBLE, sizeof(double), root);
    d2h(od, dd, n * sizeof(double));
    e = 0;
    for (long i = 0; i < n; i++) e = fmax(e, fabs(od[i] - field(root, i)));
    report("device bcast f64", e, lim_f64());

    /* point to point: Sendrecv ring f32 */
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (long i = 0; i < n; i++) hf[i] = (float)field(rank + 5, i);
    h2d(df, hf, n * sizeof(float));
    sendrecv(df, next, dfo, prev, n, MPI_FLOAT, sizeof(float));
    d2h(of, dfo, n * sizeof(float));
    e = 0;
    for (long i = 0; i < n; i++) e = fmax(e, fabs(of[i] - (float)field(prev + 5, i)));
    report("device sendrecv ring f32", e, tol + 1e-7);

    /* Send/Recv f64, rank 0 to rank 1 */
    e = 0;
    if (size > 1 && rank < 2) {
        for (long i = 0; i < n; i++) hd[i] = rank == 0 ? field(9, i) : -7.0;
        h2d(dd, hd, n * sizeof(double));
        if (rank == 0) send(dd, n, MPI_DOUBLE, sizeof(double), 1);
        else {
            int got = recv(dd, n, MPI_DOUBLE, sizeof(double), 0);
            d2h(od, dd, n * sizeof(double));
            for (long i = 0; i < n; i++) e = fmax(e, fabs(od[i] - field(9, i)));
            if (got != n) e = INFINITY;
        }
    }
    report("device send/recv f64", e, lim_f64());

    /* Isend/Irecv/Waitall ring, double complex */
    for (long i = 0; i < n; i++) hc[i] = field(rank + 2, i) - I * field(rank + 4, i);
    h2d(dc, hc, n * sizeof(double complex));
    isend_irecv(dc, next, dco, prev, n, MPI_C_DOUBLE_COMPLEX, sizeof(double complex));
    d2h(oc, dco, n * sizeof(double complex));
    e = 0;
    for (long i = 0; i < n; i++) {
        double complex want = field(prev + 2, i) - I * field(prev + 4, i);
        e = fmax(e, fmax(fabs(creal(oc[i]) - creal(want)), fabs(cimag(oc[i]) - cimag(want))));
    }
    report("device isend/irecv ring double complex", e, lim_f64());

    /* a small message (below ZCOMM_MIN_BYTES): exact, into a larger receive buffer */
    e = 0;
    if (size > 1 && rank < 2) {
        for (long i = 0; i < 1000; i++) hf[i] = rank == 0 ? (float)field(11, i) : -3.0f;
        h2d(df, hf, 1000 * sizeof(float));
        if (rank == 0) send(df, 100, MPI_FLOAT, sizeof(float), 1);
        else {
            int got = recv(df, 1000, MPI_FLOAT, sizeof(float), 0);
            d2h(of, df, 1000 * sizeof(float));
            for (long i = 0; i < 100; i++) e = fmax(e, fabs(of[i] - (float)field(11, i)));
            for (long i = 100; i < 1000; i++) e = fmax(e, fabs(of[i] + 3.0f)); /* untouched */
            if (got != 100) e = INFINITY;
        }
    }
    report("device small send/recv f32 (exact)", e, 0.0);

    /* allreduce f32 on managed memory (host-visible: no staging by the program needed) */
    float *ms, *mr;
    CK(cudaMallocManaged((void **)&ms, n * sizeof(float), cudaMemAttachGlobal));
    CK(cudaMallocManaged((void **)&mr, n * sizeof(float), cudaMemAttachGlobal));
    for (long i = 0; i < n; i++) ms[i] = (float)field(rank + 1, i);
    CK(cudaDeviceSynchronize());
    MPI_Allreduce(ms, mr, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    e = 0;
    for (long i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) want += (float)field(r + 1, i);
        e = fmax(e, fabs(mr[i] - want));
    }
    report("managed allreduce f32", e, lim_f32());
    CK(cudaFree(ms));
    CK(cudaFree(mr));

    CK(cudaFree(df));
    CK(cudaFree(dfo));
    CK(cudaFree(dd));
    CK(cudaFree(dc));
    CK(cudaFree(dco));
    free(hf), free(of), free(hd), free(od), free(hc), free(oc);
}

/* rank 0 managed buffers, the others host buffers: one allreduce, exact (passed through) */
static void mixed(void) {
    const long n = 200003;
    float *s, *r;
    if (rank == 0) {
        CK(cudaMallocManaged((void **)&s, n * sizeof(float), cudaMemAttachGlobal));
        CK(cudaMallocManaged((void **)&r, n * sizeof(float), cudaMemAttachGlobal));
    } else {
        s = malloc(n * sizeof(float));
        r = malloc(n * sizeof(float));
    }
    for (long i = 0; i < n; i++) s[i] = (float)(i % 1000) * 0.5f + rank;
    if (rank == 0) CK(cudaDeviceSynchronize());
    MPI_Allreduce(s, r, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double e = 0;
    for (long i = 0; i < n; i++) {
        double want = 0;
        for (int q = 0; q < size; q++) want += (float)(i % 1000) * 0.5f + q;
        e = fmax(e, fabs(r[i] - want));
    }
    report("mixed managed/host allreduce (exact)", e, 0.0);
    if (rank == 0) {
        CK(cudaFree(s));
        CK(cudaFree(r));
    } else {
        free(s);
        free(r);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void timing(long n, int iters, const char *label) {
    float *h = malloc(n * sizeof(float));
    for (long i = 0; i < n; i++) h[i] = (float)field(rank, i);
    float *s = dalloc(n * sizeof(float)), *o = dalloc((size_t)n * size * sizeof(float));
    h2d(s, h, n * sizeof(float));
    double *t = malloc(iters * sizeof(double));
    const char *ops[] = {"allreduce", "reduce_scatter_block", "allgather", "bcast", "sendrecv"};
    for (int k = 0; k < 5; k++) {
        for (int it = -1; it < iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (k == 0) allreduce(s, o, n, MPI_FLOAT, sizeof(float));
            if (k == 1) reduce_scatter(s, o, n / size, MPI_FLOAT, sizeof(float));
            if (k == 2) allgather(s, o, n, MPI_FLOAT, sizeof(float));
            if (k == 3) bcast(s, n, MPI_FLOAT, sizeof(float), 0);
            if (k == 4) sendrecv(s, (rank + 1) % size, o, (rank + size - 1) % size, n, MPI_FLOAT, sizeof(float));
            CK(cudaDeviceSynchronize());
            double dt = MPI_Wtime() - t0, slow;
            MPI_Allreduce(&dt, &slow, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (it >= 0) t[it] = slow;
        }
        qsort(t, iters, sizeof(double), cmp);
        if (rank == 0)
            printf("time %s %s %ld %.3f %.3f\n", label, ops[k], n * (long)sizeof(float), t[0] * 1e3, t[iters / 2] * 1e3);
        /* bcast overwrote s on the other ranks: restore the field */
        if (k == 3) h2d(s, h, n * sizeof(float));
    }
    CK(cudaFree(s));
    CK(cudaFree(o));
    free(h);
    free(t);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: pmpi_device TOL [--time N ITERS] [--stage-self] [--mixed] [--label L]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    tol = atof(argv[1]);
    long tn = 0;
    int iters = 0, do_mixed = 0;
    const char *label = "run";
    for (int a = 2; a < argc; a++) {
        if (strcmp(argv[a], "--stage-self") == 0) stage_self = 1;
        else if (strcmp(argv[a], "--mixed") == 0) do_mixed = 1;
        else if (strcmp(argv[a], "--label") == 0 && a + 1 < argc) label = argv[++a];
        else if (strcmp(argv[a], "--time") == 0 && a + 2 < argc) {
            tn = atol(argv[++a]);
            iters = atoi(argv[++a]);
        } else {
            if (rank == 0) fprintf(stderr, "pmpi_device: unknown argument %s\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    CK(cudaSetDevice(rank % ndev));
    checks();
    if (do_mixed) mixed();
    if (tn > 0 && iters > 0) timing(tn, iters, label);
    if (rank == 0) printf("%s\n", failed ? "pmpi_device: FAILED" : "pmpi_device: all passed");
    MPI_Finalize();
    return failed;
}
