"""An ordinary mpi4py program (knows nothing of zcomm): the buffer-based calls libzcomm_mpi.so
intercepts, on smooth float32/float64/complex64 numpy arrays, checked against references computed
locally. Usage: mpirun -n P python3 pmpi_test.py TOL  (TOL: the E of ZCOMM_ERROR_BOUND=abs:E).
Prints one line per check on rank 0 and exits 1 on a failure."""

import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
tol = float(sys.argv[1])
n = 200003
failed = False


def field(r, dtype=np.float64, m=n):
    i = np.arange(m, dtype=np.float64)
    return (np.sin(1e-4 * i + 0.7 * r) + 0.25 * np.cos(3e-5 * i * (r + 1))).astype(dtype)


def check(name, err, limit):
    global failed
    err = comm.allreduce(float(err), op=MPI.MAX)  # pickle-based: passes through
    bad = not err <= limit
    failed |= bad
    if rank == 0:
        print(f"{'FAIL' if bad else 'ok  '} {name:<36} max_err {err:.3e} (limit {limit:.3e})")


lim32 = tol + 4 * size * 6e-8 * (size + 1)
lim64 = tol + 1e-12

# Allreduce float32 / float64 in place / complex64
a = field(rank, np.float32)
b = np.empty_like(a)
comm.Allreduce(a, b, op=MPI.SUM)
ref = sum(field(r, np.float32).astype(np.float64) for r in range(size))
check("Allreduce float32", np.max(np.abs(b - ref)), lim32)

d = field(rank)
comm.Allreduce(MPI.IN_PLACE, d, op=MPI.SUM)
check("Allreduce float64 in place", np.max(np.abs(d - sum(field(r) for r in range(size)))), lim64)

c = (field(rank, np.float32) + 1j * field(rank + 7, np.float32)).astype(np.complex64)
cc = np.empty_like(c)
comm.Allreduce(c, cc, op=MPI.SUM)
cref = sum(
    field(r, np.float32).astype(np.float64) + 1j * field(r + 7, np.float32).astype(np.float64)
    for r in range(size)
)
check("Allreduce complex64", max(np.max(np.abs(cc.real - cref.real)), np.max(np.abs(cc.imag - cref.imag))), lim32)

# Iallreduce float64 (Wait; the send buffer is a temporary that mpi4py does not keep alive),
# float32 in place (Test polled until done)
ib64 = np.empty(n)
comm.Iallreduce(field(rank), ib64, op=MPI.SUM).Wait()
check("Iallreduce float64 + Wait", np.max(np.abs(ib64 - sum(field(r) for r in range(size)))), lim64)
ia32 = field(rank, np.float32)
rq = comm.Iallreduce(MPI.IN_PLACE, ia32, op=MPI.SUM)
while not rq.Test():
    pass
check("Iallreduce float32 in place + Test", np.max(np.abs(ia32 - ref)), lim32)

# exact: int64 sum, float32 max
ia = (np.arange(n, dtype=np.int64) * 7 + rank * 13) % 1000
ib = np.empty_like(ia)
comm.Allreduce(ia, ib, op=MPI.SUM)
iref = sum((np.arange(n, dtype=np.int64) * 7 + r * 13) % 1000 for r in range(size))
check("Allreduce int64 sum (exact)", np.max(np.abs(ib - iref)), 0)
comm.Allreduce(a, b, op=MPI.MAX)
mref = np.max([field(r, np.float32) for r in range(size)], axis=0)
check("Allreduce float32 max (exact)", np.max(np.abs(b - mref)), 0)

# Allgather, Bcast, Reduce_scatter_block
g = np.empty((size, 70001), dtype=np.float32)
comm.Allgather(field(rank, np.float32, 70001), g)
check(
    "Allgather float32",
    max(np.max(np.abs(g[r] - field(r, np.float32, 70001))) for r in range(size)),
    lim32,
)
bc = field(size - 1) if rank == size - 1 else np.zeros(n)
comm.Bcast(bc, root=size - 1)
check("Bcast float64", np.max(np.abs(bc - field(size - 1))), lim64)
blk = 50001
rs = np.empty(blk)
comm.Reduce_scatter_block(field(rank, m=blk * size), rs, op=MPI.SUM)
rsref = sum(field(r, m=blk * size) for r in range(size))[rank * blk : (rank + 1) * blk]
check("Reduce_scatter_block float64", np.max(np.abs(rs - rsref)), lim64)

# point to point: Sendrecv ring, Isend/Irecv
right, left = (rank + 1) % size, (rank - 1) % size
rv = np.empty(n, dtype=np.float32)
comm.Sendrecv(a, dest=right, sendtag=3, recvbuf=rv, source=left, recvtag=3)
check("Sendrecv float32", np.max(np.abs(rv - field(left, np.float32))), lim32)
rq = comm.Irecv(rv, source=left, tag=4)
sq = comm.Isend(a, dest=right, tag=4)
MPI.Request.Waitall([rq, sq])
check("Isend/Irecv/Waitall float32", np.max(np.abs(rv - field(left, np.float32))), lim32)

ok = not comm.allreduce(failed, op=MPI.LOR)
if rank == 0:
    print("PASSED" if ok else "FAILED")
sys.exit(0 if ok else 1)
