/* libemp-fi.so, the libfabric provider "emp": FI_RMA. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

static ssize_t rma_read(struct fid_ep *e, void *b, size_t l, void *d, fi_addr_t s, uint64_t a, uint64_t k, void *c)
{ (void)e, (void)b, (void)l, (void)d, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_readv(struct fid_ep *e, const struct iovec *i, void **d, size_t n, fi_addr_t s, uint64_t a,
			 uint64_t k, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_msg(struct fid_ep *e, const struct fi_msg_rma *m, uint64_t f) { (void)e, (void)m, (void)f; NOSYS_BODY; }
static ssize_t rma_write(struct fid_ep *e, const void *b, size_t l, void *d, fi_addr_t s, uint64_t a, uint64_t k,
			 void *c)
{ (void)e, (void)b, (void)l, (void)d, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_writev(struct fid_ep *e, const struct iovec *i, void **d, size_t n, fi_addr_t s, uint64_t a,
			  uint64_t k, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_inject(struct fid_ep *e, const void *b, size_t l, fi_addr_t s, uint64_t a, uint64_t k)
{ (void)e, (void)b, (void)l, (void)s, (void)a, (void)k; NOSYS_BODY; }
static ssize_t rma_writedata(struct fid_ep *e, const void *b, size_t l, void *d, uint64_t x, fi_addr_t s,
			     uint64_t a, uint64_t k, void *c)
{ (void)e, (void)b, (void)l, (void)d, (void)x, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_injectdata(struct fid_ep *e, const void *b, size_t l, uint64_t x, fi_addr_t s, uint64_t a,
			      uint64_t k)
{ (void)e, (void)b, (void)l, (void)x, (void)s, (void)a, (void)k; NOSYS_BODY; }

struct fi_ops_rma rma_ops = {
	.size = sizeof(struct fi_ops_rma),
	.read = rma_read, .readv = rma_readv, .readmsg = rma_msg,
	.write = rma_write, .writev = rma_writev, .writemsg = rma_msg,
	.inject = rma_inject, .writedata = rma_writedata, .injectdata = rma_injectdata,
};
