/* libemp-fi.so, the libfabric provider "emp": FI_ATOMIC. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

static ssize_t at_write(struct fid_ep *e, const void *b, size_t n, void *d, fi_addr_t s, uint64_t a, uint64_t k,
			enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_writev(struct fid_ep *e, const struct fi_ioc *i, void **d, size_t n, fi_addr_t s, uint64_t a,
			 uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_writemsg(struct fid_ep *e, const struct fi_msg_atomic *m, uint64_t f) { (void)e, (void)m, (void)f; NOSYS_BODY; }
static ssize_t at_inject(struct fid_ep *e, const void *b, size_t n, fi_addr_t s, uint64_t a, uint64_t k,
			 enum fi_datatype t, enum fi_op o)
{ (void)e, (void)b, (void)n, (void)s, (void)a, (void)k, (void)t, (void)o; NOSYS_BODY; }
static ssize_t at_rw(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t s, uint64_t a,
		     uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_rwv(struct fid_ep *e, const struct fi_ioc *i, void **d, size_t n, struct fi_ioc *r, void **rd,
		      size_t rn, fi_addr_t s, uint64_t a, uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)r, (void)rd, (void)rn, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_rwmsg(struct fid_ep *e, const struct fi_msg_atomic *m, struct fi_ioc *r, void **rd, size_t rn,
			uint64_t f)
{ (void)e, (void)m, (void)r, (void)rd, (void)rn, (void)f; NOSYS_BODY; }
static ssize_t at_cw(struct fid_ep *e, const void *b, size_t n, void *d, const void *cmp, void *cd, void *r, void *rd,
		     fi_addr_t s, uint64_t a, uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)cmp, (void)cd, (void)r, (void)rd, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_cwv(struct fid_ep *e, const struct fi_ioc *i, void **d, size_t n, const struct fi_ioc *cmp,
		      void **cd, size_t cn, struct fi_ioc *r, void **rd, size_t rn, fi_addr_t s, uint64_t a,
		      uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)cmp, (void)cd, (void)cn, (void)r, (void)rd, (void)rn, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_cwmsg(struct fid_ep *e, const struct fi_msg_atomic *m, const struct fi_ioc *cmp, void **cd,
			size_t cn, struct fi_ioc *r, void **rd, size_t rn, uint64_t f)
{ (void)e, (void)m, (void)cmp, (void)cd, (void)cn, (void)r, (void)rd, (void)rn, (void)f; NOSYS_BODY; }
static int at_valid(struct fid_ep *e, enum fi_datatype t, enum fi_op o, size_t *n)
{ (void)e, (void)t, (void)o, (void)n; NOSYS_BODY; }

struct fi_ops_atomic atomic_ops = {
	.size = sizeof(struct fi_ops_atomic),
	.write = at_write, .writev = at_writev, .writemsg = at_writemsg, .inject = at_inject,
	.readwrite = at_rw, .readwritev = at_rwv, .readwritemsg = at_rwmsg,
	.compwrite = at_cw, .compwritev = at_cwv, .compwritemsg = at_cwmsg,
	.writevalid = at_valid, .readwritevalid = at_valid, .compwritevalid = at_valid,
};
