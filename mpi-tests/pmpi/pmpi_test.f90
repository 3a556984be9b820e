! An ordinary Fortran MPI program (`use mpi`, knows nothing of zcomm): the collectives that
! libzcomm_mpi.so compresses from Fortran, on smooth real(4)/real(8)/complex(4) data, checked
! against references computed locally; integer and MPI_MAX reductions must be exact and are
! hashed into the CHECKSUM line (compared with a run without the library).
!   pmpi_test_f TOL      (TOL: the E of ZCOMM_ERROR_BOUND=abs:E)
! Prints one line per check on rank 0, CHECKSUM, PASSED/FAILED; exits 1 on a failure.
program pmpi_test_f
  use mpi
  implicit none
  integer, parameter :: n = 200003, blk = 50001, m = 70001
  integer :: ierr, rank, nranks, i, r, req, bad, anybad
  real(8), allocatable :: a(:), b(:), rs(:), ref(:)
  real(4), allocatable :: f(:), g(:), ag(:, :)
  complex(4), allocatable :: c(:), cc(:)
  integer, allocatable :: ia(:), ib(:)
  real(8) :: tol, e, lim4, lim8, s
  character(len=32) :: arg
  integer(8) :: h

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_command_argument(1, arg)
  read (arg, *) tol
  lim8 = tol + 1d-12
  lim4 = tol + 4d0 * nranks * 6d-8 * (nranks + 1)
  bad = 0
  h = 1469598103
  allocate (a(n), b(n), ref(n), f(n), g(n), c(n), cc(n), ia(n), ib(n), rs(blk))
  do i = 1, n
    a(i) = field(rank, i)
    f(i) = real(field(rank, i), 4)
    c(i) = cmplx(real(field(rank, i), 4), real(field(rank + 7, i), 4), 4)
    ia(i) = mod(i * 7 + rank * 13, 1000)
    ref(i) = 0
    do r = 0, nranks - 1
      ref(i) = ref(i) + field(r, i)
    end do
  end do

  ! MPI_Allreduce real(8) sum
  call MPI_Allreduce(a, b, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check('MPI_Allreduce real(8) sum', maxval(abs(b - ref)), lim8)
  ! MPI_Allreduce real(4) sum, MPI_IN_PLACE
  g = f
  call MPI_Allreduce(MPI_IN_PLACE, g, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  e = 0
  do i = 1, n
    s = 0
    do r = 0, nranks - 1
      s = s + real(field(r, i), 4)
    end do
    e = max(e, abs(g(i) - s))
  end do
  call check('MPI_Allreduce real(4) in place', e, lim4)
  ! MPI_Allreduce complex(4) sum
  call MPI_Allreduce(c, cc, n, MPI_COMPLEX, MPI_SUM, MPI_COMM_WORLD, ierr)
  e = 0
  do i = 1, n
    s = 0
    do r = 0, nranks - 1
      s = s + real(field(r + 7, i), 4)
    end do
    e = max(e, abs(aimag(cc(i)) - s))
  end do
  call check('MPI_Allreduce complex imag part', e, lim4)
  ! exact: integer sum, real(4) max
  call MPI_Allreduce(ia, ib, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  e = 0
  do i = 1, n
    s = 0
    do r = 0, nranks - 1
      s = s + mod(i * 7 + r * 13, 1000)
    end do
    e = max(e, abs(ib(i) - s))
    h = mod(h * 31 + ib(i), 1000000007_8)
  end do
  call check('MPI_Allreduce integer sum (exact)', e, 0d0)
  call MPI_Allreduce(f, g, n, MPI_REAL, MPI_MAX, MPI_COMM_WORLD, ierr)
  do i = 1, n
    h = mod(h * 31 + int(g(i) * 1e6, 8), 1000000007_8)
  end do
  ! MPI_Iallreduce real(8) + MPI_Wait
  call MPI_Iallreduce(a, b, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, req, ierr)
  call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
  call check('MPI_Iallreduce real(8) + MPI_Wait', maxval(abs(b - ref)), lim8)
  ! MPI_Bcast real(8) from the last rank
  if (rank == nranks - 1) then
    b = a
  else
    b = 0
  end if
  call MPI_Bcast(b, n, MPI_DOUBLE_PRECISION, nranks - 1, MPI_COMM_WORLD, ierr)
  e = 0
  do i = 1, n
    e = max(e, abs(b(i) - field(nranks - 1, i)))
  end do
  call check('MPI_Bcast real(8)', e, lim8)
  ! MPI_Reduce_scatter_block real(8): block `rank` of the sum of a(1:blk*nranks)
  call MPI_Reduce_scatter_block(a, rs, blk, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (blk * nranks <= n) then
    call check('MPI_Reduce_scatter_block real(8)', &
               maxval(abs(rs - ref(rank * blk + 1:(rank + 1) * blk))), lim8)
  end if

  ! MPI_Allgather real(4): column r+1 is rank r's first m values
  allocate (ag(m, nranks))
  call MPI_Allgather(f, m, MPI_REAL, ag, m, MPI_REAL, MPI_COMM_WORLD, ierr)
  e = 0
  do r = 0, nranks - 1
    do i = 1, m
      e = max(e, abs(ag(i, r + 1) - real(field(r, i), 4)))
    end do
  end do
  call check('MPI_Allgather real(4)', e, lim4)

  call MPI_Allreduce(bad, anybad, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) then
    print '(a,i0)', 'CHECKSUM ', h
    if (anybad == 0) then
      print '(a)', 'PASSED'
    else
      print '(a)', 'FAILED'
    end if
  end if
  call MPI_Finalize(ierr)
  if (anybad /= 0) call exit(1)

contains

  real(8) function field(rr, ii)
    integer, intent(in) :: rr, ii
    field = sin(1d-4 * ii + 0.7d0 * rr) + 0.25d0 * cos(3d-5 * ii * (rr + 1))
  end function

  subroutine check(name, err, limit)
    character(len=*), intent(in) :: name
    real(8), intent(in) :: err, limit
    real(8) :: all
    integer :: ie
    character(len=36) :: label
    label = name
    call MPI_Allreduce(err, all, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ie)
    if (.not. (all <= limit)) bad = 1
    if (rank == 0) then
      if (all <= limit) then
        print '(a,a,a,es10.3,a,es10.3,a)', 'ok   ', label, ' max_err ', all, ' (limit ', limit, ')'
      else
        print '(a,a,a,es10.3,a,es10.3,a)', 'FAIL ', label, ' max_err ', all, ' (limit ', limit, ')'
      end if
    end if
  end subroutine
end program
