/* Shared by the provider's unit test program's parts (fi_emp_unit.c,
 * fi_emp_rma.c): TAP checks. */
#ifndef FI_EMP_UNIT_H
#define FI_EMP_UNIT_H

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

/* One TAP line: "ok N - ..." or "not ok N - ...". */
void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define EXPECT(call, want)                                                                              \
	do {                                                                                            \
		long got_ = (long)(call);                                                               \
		check(got_ == (long)(want), "%s == %s (got %ld: %s)", #call, #want, got_,              \
		      got_ < 0 ? fi_strerror((int)-got_) : "");                                         \
	} while (0)

/* fi_emp_probe.c: one entry or error entry from cq, waiting up to ~10 s:
 * 1 for an entry, 0 for an error entry (in *ee), < 0 on timeout. */
struct fi_cq_tagged_entry;
struct fi_cq_err_entry;
int entry_or_error(struct fid_cq *cq, struct fi_cq_tagged_entry *e, fi_addr_t *src, struct fi_cq_err_entry *ee);

/* fi_emp_rma.c: FI_RMA's fi_getinfo answers, and the calls on two
 * endpoints opened with caps (their own domains on fabric). */
void test_rma_getinfo(void);
void test_rma(struct fid_fabric *fabric, uint64_t caps);
/* fi_emp_rma.c: FI_ATOMIC on two endpoints. */
void test_atomic(struct fid_fabric *fabric);
/* fi_emp_rma.c: FI_COLLECTIVE on three endpoints. */
void test_coll(struct fid_fabric *fabric);
/* fi_emp_probe.c: FI_PEEK, FI_CLAIM and FI_DISCARD on two endpoints. */
void test_probe(struct fid_fabric *fabric, struct fi_info *info);

#endif
