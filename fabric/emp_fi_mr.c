/* libemp-fi.so, the libfabric provider "emp": memory registration. See
 * emp_fi.h and fabric/README.md. */

#include "emp_fi.h"

/* ---- memory registration --------------------------------------------------- */

static int mr_close(struct fid *fid)
{
	struct emp_fi_mr *mr = container_of(fid, struct emp_fi_mr, mr.fid);
	struct emp_fi_domain *dom = mr->dom;
	int r = emp_dereg_mr(dom->dev, (uint32_t)mr->mr.key);
	pthread_mutex_lock(&dom->lock);
	dom->refs--;
	pthread_mutex_unlock(&dom->lock);
	free(mr);
	return r < 0 ? r : 0;
}

static struct fi_ops mr_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = mr_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
		  uint64_t requested_key, uint64_t flags, struct fid_mr **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain.fid);
	/* Keys are the NIC's (FI_MR_PROV_KEY) and remote addresses are offsets
	 * into the region (no FI_MR_VIRT_ADDR with RMA): both asks are moot. */
	(void)offset, (void)requested_key;
	if (fid->fclass != FI_CLASS_DOMAIN || !out)
		return -FI_EINVAL;
	if (flags)
		return -FI_EBADFLAGS;
	if ((access & ~(uint64_t)EMP_MR_ACCESS) || (!buf && len) || !len)
		return -FI_EINVAL;
	uint32_t emp_access = EMP_ACCESS_LOCAL_READ | EMP_ACCESS_LOCAL_WRITE;
	if (access & FI_REMOTE_READ)
		emp_access |= EMP_ACCESS_REMOTE_READ;
	if (access & FI_REMOTE_WRITE) /* atomics change memory: they need the write right */
		emp_access |= EMP_ACCESS_REMOTE_WRITE | EMP_ACCESS_REMOTE_ATOMIC;
	struct emp_fi_mr *mr = calloc(1, sizeof *mr);
	if (!mr)
		return -FI_ENOMEM;
	int64_t key = emp_reg_mr(dom->dev, buf, len, emp_access);
	if (key < 0) {
		free(mr);
		return (int)key;
	}
	mr->mr.fid.fclass = FI_CLASS_MR;
	mr->mr.fid.context = context;
	mr->mr.fid.ops = &mr_fi_ops;
	mr->mr.mem_desc = mr;
	/* The 64-bit key is EMP's remote key: the region's key in the low 32
	 * bits (what local descriptors use), its secret in the high 32. */
	uint64_t rkey;
	int rk = emp_remote_key(dom->dev, (uint32_t)key, &rkey);
	if (rk < 0) {
		emp_dereg_mr(dom->dev, (uint32_t)key);
		free(mr);
		return rk;
	}
	mr->mr.key = rkey;
	mr->dom = dom;
	mr->addr = (uintptr_t)buf;
	mr->len = len;
	pthread_mutex_lock(&dom->lock);
	dom->refs++;
	pthread_mutex_unlock(&dom->lock);
	*out = &mr->mr;
	return 0;
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access, uint64_t offset,
		   uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{
	if (count != 1 || !iov)
		return -FI_EINVAL; /* mr_iov_limit is 1 */
	return mr_reg(fid, iov[0].iov_base, iov[0].iov_len, access, offset, requested_key, flags, mr, context);
}

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr)
{
	if (!attr)
		return -FI_EINVAL;
	if (attr->iface != FI_HMEM_SYSTEM)
		return -FI_ENOSYS;
	return mr_regv(fid, attr->mr_iov, attr->iov_count, attr->access, attr->offset, attr->requested_key, flags,
		       mr, attr->context);
}

struct fi_ops_mr mr_ops = {
	.size = sizeof(struct fi_ops_mr),
	.reg = mr_reg,
	.regv = mr_regv,
	.regattr = mr_regattr,
};
