/* An ordinary MPI program that knows nothing of zcomm: it calls the functions libzcomm_mpi.so
 * intercepts on smooth float/double/complex data and checks every result against a reference
 * it computes itself (every rank can generate every rank's data).
 *
 *   pmpi_test TOL [--die-rank R | --only CASE]
 *
 * TOL: the largest absolute error accepted on compressed float results (the runner passes the
 * E of ZCOMM_ERROR_BOUND=abs:E; without LD_PRELOAD the results are exact up to rounding).
 * Integer and MPI_MAX reductions and messages below the threshold must be exact; their bytes are
 * hashed into the CHECKSUM line, which the runner compares between runs with and without the
 * library (bit-for-bit pass-through). --die-rank R: rank R kills itself in the middle of a
 * series of collectives (fault test: the job must end). --only CASE: run one checked operation
 * only (allreduce, iallreduce, allgather, bcast, send: rank 0 to rank 1), for the
 * corrupted-message test (a damaged compressed payload must end the job with an error, never
 * give wrong data).
 *
 * Prints one "ok NAME max_err" line per check on rank 0, "CHECKSUM x" and exits 1 on failure. */
#include <complex.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size, failed = 0;
static double tol;
static uint64_t checksum = 1469598103934665603ull;

static void hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        checksum ^= b[i];
        checksum *= 1099511628211ull;
    }
}

/* smooth field of rank r */
static double field(int r, long i) { return sin(1e-4 * (double)i + 0.7 * r) + 0.25 * cos(3e-5 * (double)i * (r + 1)); }

static void report(const char *name, double err, double limit) {
    double all;
    MPI_Allreduce(&err, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int bad = !(all <= limit);
    if (rank == 0) printf("%s %-36s max_err %.3e (limit %.3e)\n", bad ? "FAIL" : "ok  ", name, all, limit);
    if (bad) failed = 1;
}

/* the limit of a compressed float result: the bound plus float rounding of values of size ~p */
static double lim_f32(void) { return tol + 4.0 * size * 6e-8 * (size + 1); }
static double lim_f64(void) { return tol + 1e-12; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: pmpi_test TOL [--die-rank R]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    tol = atof(argv[1]);
    /* the thread level the program sees must not change under the library (checksum) */
    int level = -1;
    MPI_Query_thread(&level);
    hash_bytes(&level, sizeof level);
    int die = -1;
    const char *only = NULL;
    if (argc >= 4 && strcmp(argv[2], "--die-rank") == 0) die = atoi(argv[3]);
    if (argc >= 4 && strcmp(argv[2], "--only") == 0) only = argv[3];
    const long n = 200003; /* not a multiple of any rank count */

    /* ---- one operation only (corrupted-message test) */
    if (only) {
        double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), e = 0;
        for (long i = 0; i < n; i++) a[i] = field(rank, i);
        if (strcmp(only, "allreduce") == 0 || strcmp(only, "iallreduce") == 0) {
            if (only[0] == 'i') {
                MPI_Request q;
                MPI_Iallreduce(a, b, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &q);
                MPI_Wait(&q, MPI_STATUS_IGNORE);
            } else {
                MPI_Allreduce(a, b, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            }
            for (long i = 0; i < n; i++) {
                double ref = 0;
                for (int r = 0; r < size; r++) ref += field(r, i);
                e = fmax(e, fabs(b[i] - ref));
            }
        } else if (strcmp(only, "allgather") == 0) {
            long m = n / size;
            MPI_Allgather(a, (int)m, MPI_DOUBLE, b, (int)m, MPI_DOUBLE, MPI_COMM_WORLD);
            for (int r = 0; r < size; r++)
                for (long i = 0; i < m; i++) e = fmax(e, fabs(b[r * m + i] - field(r, i)));
        } else if (strcmp(only, "bcast") == 0) {
            MPI_Bcast(a, (int)n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            for (long i = 0; i < n; i++) e = fmax(e, fabs(a[i] - field(0, i)));
        } else if (strcmp(only, "send") == 0) {
            if (rank == 0) MPI_Send(a, (int)n, MPI_DOUBLE, 1, 3, MPI_COMM_WORLD);
            if (rank == 1) {
                MPI_Recv(b, (int)n, MPI_DOUBLE, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (long i = 0; i < n; i++) e = fmax(e, fabs(b[i] - field(0, i)));
            }
        } else {
            if (rank == 0) fprintf(stderr, "unknown --only case %s\n", only);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        char name[64];
        snprintf(name, sizeof name, "--only %s", only);
        report(name, e, lim_f64());
        if (rank == 0) printf("%s\n", failed ? "FAILED" : "PASSED");
        MPI_Finalize();
        return failed;
    }

    /* ---- fault test: a rank dies in the middle of a series of allreduces */
    if (die >= 0) {
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (long i = 0; i < n; i++) a[i] = (float)field(rank, i);
        for (int it = 0; it < 1000; it++) {
            if (it == 3 && rank == die) {
                fprintf(stderr, "rank %d: killing myself in the middle of the allreduces\n", rank);
                raise(SIGKILL);
            }
            MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        MPI_Finalize();
        return 0;
    }

    /* ---- MPI_Allreduce float SUM */
    {
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (long i = 0; i < n; i++) a[i] = (float)field(rank, i);
        MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double e = 0;
        for (long i = 0; i < n; i++) {
            double ref = 0;
            for (int r = 0; r < size; r++) ref += (double)(float)field(r, i);
            e = fmax(e, fabs(b[i] - ref));
        }
        report("MPI_Allreduce float sum", e, lim_f32());
        free(a);
        free(b);
    }
    /* ---- MPI_Allreduce double SUM, MPI_IN_PLACE */
    {
        double *a = malloc(n * sizeof *a);
        for (long i = 0; i < n; i++) a[i] = field(rank, i);
        MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double e = 0;
        for (long i = 0; i < n; i++) {
            double ref = 0;
            for (int r = 0; r < size; r++) ref += field(r, i);
            e = fmax(e, fabs(a[i] - ref));
        }
        report("MPI_Allreduce double sum in place", e, lim_f64());
        free(a);
    }
    /* ---- MPI_Allreduce complex float SUM */
    {
        float complex *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (long i = 0; i < n; i++) a[i] = (float)field(rank, i) + I * (float)field(rank + 7, i);
        MPI_Allreduce(a, b, (int)n, MPI_C_FLOAT_COMPLEX, MPI_SUM, MPI_COMM_WORLD);
        double e = 0;
        for (long i = 0; i < n; i++) {
            double re = 0, im = 0;
            for (int r = 0; r < size; r++) {
                re += (double)(float)field(r, i);
                im += (double)(float)field(r + 7, i);
            }
            e = fmax(e, fmax(fabs(crealf(b[i]) - re), fabs(cimagf(b[i]) - im)));
        }
        report("MPI_Allreduce complex float sum", e, lim_f32());
        free(a);
        free(b);
    }
    /* ---- exact: integer sum, float MAX, a small float sum (below the threshold) */
    {
        int *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (long i = 0; i < n; i++) a[i] = (int)(i * 7 + rank * 13) % 1000;
        MPI_Allreduce(a, b, (int)n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        double e = 0;
        for (long i = 0; i < n; i++) {
            long ref = 0;
            for (int r = 0; r < size; r++) ref += (int)(i * 7 + r * 13) % 1000;
            e = fmax(e, fabs((double)(b[i] - ref)));
        }
        report("MPI_Allreduce int sum (exact)", e, 0);
        hash_bytes(b, n * sizeof *b);
        free(a);
        free(b);
        float *f = malloc(n * sizeof *f), *g = malloc(n * sizeof *g);
        for (long i = 0; i < n; i++) f[i] = (float)field(rank, i);
        MPI_Allreduce(f, g, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
        e = 0;
        for (long i = 0; i < n; i++) {
            float ref = -INFINITY;
            for (int r = 0; r < size; r++) ref = fmaxf(ref, (float)field(r, i));
            e = fmax(e, fabs((double)(g[i] - ref)));
        }
        report("MPI_Allreduce float max (exact)", e, 0);
        hash_bytes(g, n * sizeof *g);
        MPI_Allreduce(f, g, 100, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        hash_bytes(g, 100 * sizeof *g);
        free(f);
        free(g);
    }
    /* ---- MPI_Reduce_scatter_block double */
    {
        long blk = 50001;
        double *a = malloc(blk * size * sizeof *a), *b = malloc(blk * sizeof *b);
        for (long i = 0; i < blk * size; i++) a[i] = field(rank, i);
        MPI_Reduce_scatter_block(a, b, (int)blk, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double e = 0;
        for (long i = 0; i < blk; i++) {
            double ref = 0;
            for (int r = 0; r < size; r++) ref += field(r, rank * blk + i);
            e = fmax(e, fabs(b[i] - ref));
        }
        report("MPI_Reduce_scatter_block double", e, lim_f64());
        free(a);
        free(b);
    }
    /* ---- MPI_Allgather float (and in place) */
    {
        long m = 70001;
        float *a = malloc(m * sizeof *a), *b = malloc(m * size * sizeof *b);
        for (long i = 0; i < m; i++) a[i] = (float)field(rank, i);
        MPI_Allgather(a, (int)m, MPI_FLOAT, b, (int)m, MPI_FLOAT, MPI_COMM_WORLD);
        double e = 0;
        for (int r = 0; r < size; r++)
            for (long i = 0; i < m; i++) e = fmax(e, fabs((double)b[r * m + i] - (double)(float)field(r, i)));
        report("MPI_Allgather float", e, lim_f32());
        for (long i = 0; i < m; i++) b[rank * m + i] = (float)field(rank, i);
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b, (int)m, MPI_FLOAT, MPI_COMM_WORLD);
        e = 0;
        for (int r = 0; r < size; r++)
            for (long i = 0; i < m; i++) e = fmax(e, fabs((double)b[r * m + i] - (double)(float)field(r, i)));
        report("MPI_Allgather float in place", e, lim_f32());
        free(a);
        free(b);
    }
    /* ---- MPI_Bcast double from the last rank */
    {
        double *a = malloc(n * sizeof *a);
        int root = size - 1;
        for (long i = 0; i < n; i++) a[i] = rank == root ? field(root, i) : 0.0;
        MPI_Bcast(a, (int)n, MPI_DOUBLE, root, MPI_COMM_WORLD);
        double e = 0;
        for (long i = 0; i < n; i++) e = fmax(e, fabs(a[i] - field(root, i)));
        report("MPI_Bcast double", e, lim_f64());
        free(a);
    }
    /* ---- MPI_Sendrecv ring, float */
    {
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        for (long i = 0; i < n; i++) a[i] = (float)field(rank, i);
        MPI_Status st;
        MPI_Sendrecv(a, (int)n, MPI_FLOAT, right, 5, b, (int)n, MPI_FLOAT, left, 5, MPI_COMM_WORLD, &st);
        int cnt = -1;
        MPI_Get_count(&st, MPI_FLOAT, &cnt);
        double e = (st.MPI_SOURCE == left && st.MPI_TAG == 5 && cnt == n) ? 0 : 1e30;
        for (long i = 0; i < n; i++) e = fmax(e, fabs((double)b[i] - (double)(float)field(left, i)));
        report("MPI_Sendrecv float ring (+status)", e, lim_f32());
        free(a);
        free(b);
    }
    /* ---- MPI_Send / MPI_Recv: rank 0 -> 1 with MPI_ANY_SOURCE / MPI_ANY_TAG, a larger buffer,
     * a small message then a large one on the same tag (order) */
    {
        double *a = malloc(n * sizeof *a), *b = malloc((n + 10) * sizeof *b);
        double e = 0;
        if (size < 2) {
            /* one rank: nothing to send to */
        } else if (rank == 0) {
            for (long i = 0; i < n; i++) a[i] = field(3, i);
            MPI_Send(a, 10, MPI_DOUBLE, 1, 7, MPI_COMM_WORLD);
            MPI_Send(a, (int)n, MPI_DOUBLE, 1, 7, MPI_COMM_WORLD);
        } else if (rank == 1) {
            MPI_Status st;
            MPI_Recv(b, (int)n + 10, MPI_DOUBLE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            int cnt = -1;
            MPI_Get_count(&st, MPI_DOUBLE, &cnt);
            if (cnt != 10 || st.MPI_SOURCE != 0 || st.MPI_TAG != 7) e = 1e30;
            for (long i = 0; i < 10; i++) e = fmax(e, b[i] == field(3, i) ? 0 : 1e30); /* small: exact */
            MPI_Recv(b, (int)n + 10, MPI_DOUBLE, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_DOUBLE, &cnt);
            if (cnt != n || st.MPI_SOURCE != 0 || st.MPI_TAG != 7) e = 1e30;
            for (long i = 0; i < n; i++) e = fmax(e, fabs(b[i] - field(3, i)));
        }
        report("MPI_Send/MPI_Recv double (+wildcards)", e, lim_f64());
        free(a);
        free(b);
    }
    /* ---- MPI_Isend / MPI_Irecv / MPI_Waitall: both neighbours, float */
    {
        float *s = malloc(n * sizeof *s), *l = malloc(n * sizeof *l), *r = malloc(n * sizeof *r);
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        for (long i = 0; i < n; i++) s[i] = (float)field(rank, i);
        MPI_Request q[4];
        MPI_Irecv(l, (int)n, MPI_FLOAT, left, 11, MPI_COMM_WORLD, &q[0]);
        MPI_Irecv(r, (int)n, MPI_FLOAT, right, 12, MPI_COMM_WORLD, &q[1]);
        MPI_Isend(s, (int)n, MPI_FLOAT, right, 11, MPI_COMM_WORLD, &q[2]);
        MPI_Isend(s, (int)n, MPI_FLOAT, left, 12, MPI_COMM_WORLD, &q[3]);
        MPI_Status sts[4];
        MPI_Waitall(4, q, sts);
        double e = 0;
        if (sts[0].MPI_SOURCE != left || sts[1].MPI_SOURCE != right) e = 1e30;
        for (long i = 0; i < n; i++) {
            e = fmax(e, fabs((double)l[i] - (double)(float)field(left, i)));
            e = fmax(e, fabs((double)r[i] - (double)(float)field(right, i)));
        }
        report("MPI_Isend/MPI_Irecv/MPI_Waitall float", e, lim_f32());
        /* Isend, then Wait on the send before the receive (verdicts must not deadlock) */
        MPI_Irecv(l, (int)n, MPI_FLOAT, left, 13, MPI_COMM_WORLD, &q[0]);
        MPI_Isend(s, (int)n, MPI_FLOAT, right, 13, MPI_COMM_WORLD, &q[1]);
        MPI_Wait(&q[1], MPI_STATUS_IGNORE);
        MPI_Wait(&q[0], &sts[0]);
        e = sts[0].MPI_SOURCE == left ? 0 : 1e30;
        for (long i = 0; i < n; i++) e = fmax(e, fabs((double)l[i] - (double)(float)field(left, i)));
        report("MPI_Isend/MPI_Wait(send first)/MPI_Wait", e, lim_f32());
        /* Irecv, then a blocking Send, then Wait; with MPI_Test polling */
        MPI_Irecv(l, (int)n, MPI_FLOAT, left, 14, MPI_COMM_WORLD, &q[0]);
        MPI_Send(s, (int)n, MPI_FLOAT, right, 14, MPI_COMM_WORLD);
        int flag = 0;
        while (!flag) MPI_Test(&q[0], &flag, &sts[0]);
        e = sts[0].MPI_SOURCE == left ? 0 : 1e30;
        for (long i = 0; i < n; i++) e = fmax(e, fabs((double)l[i] - (double)(float)field(left, i)));
        report("MPI_Irecv/MPI_Send/MPI_Test", e, lim_f32());
        free(s);
        free(l);
        free(r);
    }
    /* ---- MPI_Iallreduce: float + MPI_Wait; double in place + MPI_Test polled until done (and once
     * more after); several outstanding at once (compressed and pass-through ones, point-to-point
     * requests, a blocking MPI_Allreduce while they are pending), completed out of order and by
     * MPI_Waitall; MPI_Testall polling */
    {
        float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *b2 = malloc(n * sizeof *b2);
        float *mx = malloc(n * sizeof *mx), *sm = malloc(100 * sizeof *sm), *bl = malloc(n * sizeof *bl);
        float *s = malloc(n * sizeof *s), *l = malloc(n * sizeof *l);
        double *d = malloc(n * sizeof *d), *refd = malloc(n * sizeof *refd);
        float complex *c = malloc(n * sizeof *c), *cc = malloc(n * sizeof *cc);
        int *ia = malloc(n * sizeof *ia), *ib = malloc(n * sizeof *ib);
        double *reff = malloc(n * sizeof *reff);
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        for (long i = 0; i < n; i++) {
            a[i] = s[i] = (float)field(rank, i);
            d[i] = field(rank, i);
            c[i] = (float)field(rank, i) + I * (float)field(rank + 7, i);
            ia[i] = (int)(i * 5 + rank * 11) % 777;
            reff[i] = refd[i] = 0;
            for (int r = 0; r < size; r++) {
                reff[i] += (double)(float)field(r, i);
                refd[i] += field(r, i);
            }
        }
        MPI_Request q[8];
        MPI_Status sts[8];
        /* float + MPI_Wait */
        MPI_Iallreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q[0]);
        MPI_Wait(&q[0], &sts[0]);
        double e = q[0] == MPI_REQUEST_NULL ? 0 : 1e30;
        for (long i = 0; i < n; i++) e = fmax(e, fabs(b[i] - reff[i]));
        report("MPI_Iallreduce float sum + MPI_Wait", e, lim_f32());
        /* double in place + MPI_Test until done, then once more on the null request */
        MPI_Iallreduce(MPI_IN_PLACE, d, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &q[0]);
        int flag = 0;
        long tests = 0;
        while (!flag) {
            MPI_Test(&q[0], &flag, &sts[0]);
            tests++;
        }
        flag = 0;
        MPI_Test(&q[0], &flag, MPI_STATUS_IGNORE);
        e = (flag && q[0] == MPI_REQUEST_NULL && tests >= 1) ? 0 : 1e30;
        for (long i = 0; i < n; i++) e = fmax(e, fabs(d[i] - refd[i]));
        report("MPI_Iallreduce double in place + MPI_Test", e, lim_f64());
        /* several outstanding */
        MPI_Iallreduce(c, cc, (int)n, MPI_C_FLOAT_COMPLEX, MPI_SUM, MPI_COMM_WORLD, &q[0]);
        MPI_Iallreduce(a, b2, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q[1]);
        MPI_Iallreduce(ia, ib, (int)n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &q[2]);   /* pass-through */
        MPI_Iallreduce(a, mx, (int)n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD, &q[3]);  /* pass-through */
        MPI_Irecv(l, (int)n, MPI_FLOAT, left, 21, MPI_COMM_WORLD, &q[4]);
        MPI_Isend(s, (int)n, MPI_FLOAT, right, 21, MPI_COMM_WORLD, &q[5]);
        MPI_Iallreduce(a, sm, 100, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q[6]);    /* small: pass-through */
        MPI_Wait(&q[1], MPI_STATUS_IGNORE); /* out of order */
        MPI_Allreduce(a, bl, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* blocking, meanwhile */
        MPI_Waitall(7, q, sts);
        double eb = 0, e2 = 0, ec = 0, ei = 0, em = 0, ep = 0;
        for (int k = 0; k < 7; k++)
            if (q[k] != MPI_REQUEST_NULL) ei = 1e30;
        if (sts[4].MPI_SOURCE != left || sts[4].MPI_TAG != 21) ep = 1e30;
        for (long i = 0; i < n; i++) {
            double re = 0, im = 0;
            long iref = 0;
            float fm = -INFINITY;
            for (int r = 0; r < size; r++) {
                re += (double)(float)field(r, i);
                im += (double)(float)field(r + 7, i);
                iref += (int)(i * 5 + r * 11) % 777;
                fm = fmaxf(fm, (float)field(r, i));
            }
            ec = fmax(ec, fmax(fabs(crealf(cc[i]) - re), fabs(cimagf(cc[i]) - im)));
            e2 = fmax(e2, fabs(b2[i] - reff[i]));
            eb = fmax(eb, fabs(bl[i] - reff[i]));
            ei = fmax(ei, fabs((double)(ib[i] - iref)));
            em = fmax(em, fabs((double)(mx[i] - fm)));
            ep = fmax(ep, fabs((double)l[i] - (double)(float)field(left, i)));
        }
        report("MPI_Iallreduce complex float (outstanding)", ec, lim_f32());
        report("MPI_Iallreduce float, waited out of order", e2, lim_f32());
        report("MPI_Allreduce while Iallreduces pending", eb, lim_f32());
        report("MPI_Iallreduce int sum (exact)", ei, 0);
        report("MPI_Iallreduce float max (exact)", em, 0);
        report("Isend/Irecv amid Iallreduces (Waitall)", ep, lim_f32());
        hash_bytes(ib, n * sizeof *ib);
        hash_bytes(mx, n * sizeof *mx);
        hash_bytes(sm, 100 * sizeof *sm);
        /* MPI_Testall polling over two compressed ones */
        for (long i = 0; i < n; i++) d[i] = field(rank, i);
        MPI_Iallreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q[0]);
        MPI_Iallreduce(MPI_IN_PLACE, d, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &q[1]);
        flag = 0;
        while (!flag) MPI_Testall(2, q, &flag, MPI_STATUSES_IGNORE);
        e = 0;
        for (long i = 0; i < n; i++) e = fmax(e, fmax(fabs(b[i] - reff[i]), fabs(d[i] - refd[i])));
        report("MPI_Iallreduce x2 + MPI_Testall", e, lim_f32());
        /* completed at different points: rank 0 waits before a barrier, the others after it (the
         * operation must progress while they are in the barrier) */
        MPI_Iallreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q[0]);
        if (rank == 0) {
            MPI_Wait(&q[0], MPI_STATUS_IGNORE);
            MPI_Barrier(MPI_COMM_WORLD);
        } else {
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Wait(&q[0], MPI_STATUS_IGNORE);
        }
        e = 0;
        for (long i = 0; i < n; i++) e = fmax(e, fabs(b[i] - reff[i]));
        report("MPI_Iallreduce waited before/after barrier", e, lim_f32());
        free(a), free(b), free(b2), free(mx), free(sm), free(bl), free(s), free(l);
        free(d), free(refd), free(c), free(cc), free(ia), free(ib), free(reff);
    }
    /* ---- a sub-communicator (split): allreduce double on it */
    {
        MPI_Comm sub;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &sub);
        int sr, ss;
        MPI_Comm_rank(sub, &sr);
        MPI_Comm_size(sub, &ss);
        double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
        for (long i = 0; i < n; i++) a[i] = field(rank, i);
        MPI_Allreduce(a, b, (int)n, MPI_DOUBLE, MPI_SUM, sub);
        double e = 0;
        for (long i = 0; i < n; i++) {
            double ref = 0;
            for (int r = rank % 2; r < size; r += 2) ref += field(r, i);
            e = fmax(e, fabs(b[i] - ref));
        }
        report("MPI_Allreduce double on MPI_Comm_split", e, lim_f64());
        MPI_Comm_free(&sub);
        /* a communicator whose first collective is an MPI_Iallreduce, freed right after */
        MPI_Comm dup;
        MPI_Comm_dup(MPI_COMM_WORLD, &dup);
        MPI_Request q;
        MPI_Iallreduce(a, b, (int)n, MPI_DOUBLE, MPI_SUM, dup, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
        MPI_Comm_free(&dup);
        e = 0;
        for (long i = 0; i < n; i++) {
            double ref = 0;
            for (int r = 0; r < size; r++) ref += field(r, i);
            e = fmax(e, fabs(b[i] - ref));
        }
        report("MPI_Iallreduce first on MPI_Comm_dup", e, lim_f64());
        free(a);
        free(b);
    }

    /* the checksum of the pass-through results must be the same with and without the library */
    uint64_t all[64];
    MPI_Gather(&checksum, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        uint64_t c = 0;
        for (int r = 0; r < size && r < 64; r++) c = c * 31 + all[r];
        printf("CHECKSUM %016llx\n", (unsigned long long)c);
    }
    int bad = failed, anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%s\n", anybad ? "FAILED" : "PASSED");
    MPI_Finalize();
    return anybad ? 1 : 0;
}
