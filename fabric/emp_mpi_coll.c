/* libemp-mpicoll.so: MPI_Barrier and MPI_Allreduce on MPI_COMM_WORLD run
 * on EMP's NICs, for unmodified MPI programs (a PMPI library, loaded with
 * LD_PRELOAD). Open MPI's coll framework has no component that uses a
 * libfabric provider's FI_COLLECTIVE, so through `mtl ofi` its barrier and
 * allreduce are its own algorithms over point-to-point; this library puts
 * the NIC's in their place, beside the provider (docs/libfabric.md).
 *
 * At the first call on MPI_COMM_WORLD every rank opens its own EMP port on
 * its job NIC (emp_job_open_device: the NIC the provider uses too), trades
 * endpoints with PMPI_Allgather and creates one EMP group of all ranks.
 * Anything else (other communicators, datatypes or operations the NIC does
 * not combine, more than one NIC partial buffer, MPI_IN_PLACE aside) goes
 * to the PMPI call unchanged, as does everything when the setup fails
 * (said once on stderr with EMP_MPICOLL_VERBOSE=1). */

#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emp.h"

/* The group's id: the same on every rank, apart from the provider's
 * (hashes of member lists). */
#define GROUP_ID 0x4d504931u /* "MPI1" */
/* One NIC partial buffer: the provider's coll_reduce_max, at most 8 KiB. */
#define REDUCE_MAX 8192u

static enum { UNSET, READY, OFF } state;
static struct emp_device *dev;
static struct emp_group *group;
static char *bounce; /* REDUCE_MAX in, REDUCE_MAX out, registered */
static uint32_t bounce_key;
static uint64_t bounce_off;
static size_t reduce_max;

static void say_off(const char *why, int err)
{
	const char *v = getenv("EMP_MPICOLL_VERBOSE");
	if (v && *v == '1')
		fprintf(stderr, "emp-mpicoll: %s (%d): MPI's own collectives instead\n", why, err);
}

static void teardown(void)
{
	if (group)
		emp_group_destroy(dev, group);
	group = NULL;
	if (dev)
		emp_close_device(dev);
	dev = NULL;
}

/* Ranks that leave their node no core for the emulated NIC sleep at once
 * in the NIC's collectives instead of polling 20 µs first: a polling rank
 * holds a core the NIC and the ranks it waits for need (on 2 cores:
 * MPI_Barrier at 8 ranks 144 µs polling first, 71 µs sleeping at once; at
 * 2 ranks 22 µs and 8 µs, MPI_Allreduce 56 µs and 8 µs). EMP_SPIN_US,
 * when set, decides instead. Collective over MPI_COMM_WORLD. */
static void choose_spin(void)
{
	MPI_Comm node;
	int local = 0;
	if (PMPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
		return;
	PMPI_Comm_size(node, &local);
	PMPI_Comm_free(&node);
	/* The cores this rank may run on (taskset, cgroups), not the machine's. */
	cpu_set_t set;
	int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (dev && !getenv("EMP_SPIN_US") && cores > 0 && local >= cores)
		emp_set_spin_us(dev, 0);
}

/* Collective over MPI_COMM_WORLD: every rank ends READY, or every rank
 * OFF (the outcome is agreed with PMPI_Allreduce, so no rank waits on a
 * NIC barrier another rank will never post). */
static void setup(void)
{
	int err = 0, size = 0;
	PMPI_Comm_size(MPI_COMM_WORLD, &size);
	struct emp_endpoint me = {0}, *eps = calloc((size_t)size, sizeof *eps);
	struct emp_port_info pi;
	if (!eps) {
		fprintf(stderr, "emp-mpicoll: out of memory\n");
		PMPI_Abort(MPI_COMM_WORLD, 1);
	}
	dev = emp_job_open_device(&err);
	if (dev && (err = emp_query_port(dev, &pi)) == 0) {
		me.node = pi.node;
		me.port = pi.port;
		size_t frame = pi.mtu > 256 ? pi.mtu - 256 : 0;
		reduce_max = frame < REDUCE_MAX ? frame : REDUCE_MAX;
		bounce = emp_alloc(dev, 2 * REDUCE_MAX, &bounce_key, &bounce_off);
		if (!bounce)
			err = -12;
	} else if (!dev) {
		say_off("no EMP device", err);
	}
	int ok = dev && !err, all_ok = 0;
	/* Every rank takes part in the exchange, even one that failed. */
	PMPI_Allgather(&me, sizeof me, MPI_BYTE, eps, sizeof me, MPI_BYTE, MPI_COMM_WORLD);
	if (ok) {
		group = emp_group_create(dev, GROUP_ID, eps, (size_t)size, &err);
		ok = group != NULL;
		if (!ok)
			say_off("emp_group_create failed", err);
	}
	PMPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	free(eps);
	choose_spin();
	if (!all_ok) {
		teardown();
		state = OFF;
		return;
	}
	state = READY;
}

static int ready(MPI_Comm comm)
{
	if (comm != MPI_COMM_WORLD)
		return 0;
	if (state == UNSET)
		setup();
	return state == READY;
}

int MPI_Barrier(MPI_Comm comm)
{
	if (!ready(comm))
		return PMPI_Barrier(comm);
	uint32_t status = 0;
	if (emp_barrier(dev, group, EMP_BARRIER_PAIRWISE, &status) != 0) {
		fprintf(stderr, "emp-mpicoll: NIC barrier failed: %s\n", emp_wc_status_str(status));
		return MPI_ERR_INTERN;
	}
	return MPI_SUCCESS;
}

static int emp_type(MPI_Datatype t, enum emp_dtype *out, size_t *width)
{
	if (t == MPI_INT || t == MPI_INT32_T)
		*out = EMP_I32, *width = 4;
	else if (t == MPI_UNSIGNED || t == MPI_UINT32_T)
		*out = EMP_U32, *width = 4;
	else if (t == MPI_LONG || t == MPI_LONG_LONG || t == MPI_INT64_T)
		*out = EMP_I64, *width = 8;
	else if (t == MPI_UNSIGNED_LONG || t == MPI_UNSIGNED_LONG_LONG || t == MPI_UINT64_T)
		*out = EMP_U64, *width = 8;
	else if (t == MPI_FLOAT)
		*out = EMP_F32, *width = 4;
	else if (t == MPI_DOUBLE)
		*out = EMP_F64, *width = 8;
	else
		return 0;
	return 1;
}

static int emp_op(MPI_Op op, enum emp_dtype t, enum emp_reduce_op *out)
{
	int integer = t != EMP_F32 && t != EMP_F64;
	if (op == MPI_SUM)
		*out = EMP_SUM;
	else if (op == MPI_PROD)
		*out = EMP_PROD;
	else if (op == MPI_MIN)
		*out = EMP_MIN;
	else if (op == MPI_MAX)
		*out = EMP_MAX;
	else if (integer && op == MPI_BAND)
		*out = EMP_BAND;
	else if (integer && op == MPI_BOR)
		*out = EMP_BOR;
	else if (integer && op == MPI_BXOR)
		*out = EMP_BXOR;
	else
		return 0;
	return 1;
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
{
	enum emp_dtype t;
	enum emp_reduce_op o;
	size_t width;
	/* Decided from the arguments alone, which every rank passes alike. */
	if (count <= 0 || !emp_type(datatype, &t, &width) || !emp_op(op, t, &o) || !ready(comm) ||
	    (size_t)count * width > reduce_max)
		return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
	size_t len = (size_t)count * width;
	memcpy(bounce, sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf, len);
	struct emp_sge in = {.key = bounce_key, .len = (uint32_t)len, .offset = bounce_off};
	struct emp_sge out = {.key = bounce_key, .len = (uint32_t)len, .offset = bounce_off + REDUCE_MAX};
	uint32_t status = 0;
	if (emp_allreduce(dev, group, t, o, &in, &out, &status) != 0) {
		fprintf(stderr, "emp-mpicoll: NIC allreduce failed: %s\n", emp_wc_status_str(status));
		return MPI_ERR_INTERN;
	}
	memcpy(recvbuf, bounce + REDUCE_MAX, len);
	return MPI_SUCCESS;
}

int MPI_Finalize(void)
{
	/* Every rank's last NIC collective is done (they are blocking), so
	 * the group and port go before MPI does. */
	if (state == READY) {
		/* A rank's NIC may still owe a peer the last barrier's
		 * messages: no port closes before every rank is here. */
		PMPI_Barrier(MPI_COMM_WORLD);
		teardown();
	}
	state = OFF;
	return PMPI_Finalize();
}
