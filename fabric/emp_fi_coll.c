/* libemp-fi.so, the libfabric provider "emp": FI_COLLECTIVE. See emp_fi.h
 * and fabric/README.md. */

#include "emp_fi.h"

static ssize_t co_barrier(struct fid_ep *e, fi_addr_t a, void *c) { (void)e, (void)a, (void)c; NOSYS_BODY; }
static ssize_t co_barrier2(struct fid_ep *e, fi_addr_t a, uint64_t f, void *c) { (void)e, (void)a, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_bcast(struct fid_ep *e, void *b, size_t n, void *d, fi_addr_t a, fi_addr_t r, enum fi_datatype t,
			uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)a, (void)r, (void)t, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_a2a(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
		      enum fi_datatype t, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)t, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_red(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
		      enum fi_datatype t, enum fi_op o, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)t, (void)o, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_rooted_red(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
			     fi_addr_t root, enum fi_datatype t, enum fi_op o, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)root, (void)t, (void)o, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_rooted(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
			 fi_addr_t root, enum fi_datatype t, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)root, (void)t, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_msg(struct fid_ep *e, const struct fi_msg_collective *m, struct fi_ioc *r, void **rd, size_t rn,
		      uint64_t f)
{ (void)e, (void)m, (void)r, (void)rd, (void)rn, (void)f; NOSYS_BODY; }

struct fi_ops_collective coll_ops = {
	.size = sizeof(struct fi_ops_collective),
	.barrier = co_barrier, .broadcast = co_bcast, .alltoall = co_a2a, .allreduce = co_red,
	.allgather = co_a2a, .reduce_scatter = co_red, .reduce = co_rooted_red, .scatter = co_rooted,
	.gather = co_rooted, .msg = co_msg, .barrier2 = co_barrier2,
};
