/* Two processes on two NICs (the provider's RMA, atomics and collectives
 * across the wire): rank 0 and rank 1 each open an endpoint on their
 * EMP_DEVICE, exchange names and rank 0's region key through files in a
 * directory, then run barrier, broadcast, reduce and allreduce on a joined
 * group, RMA writes and reads into rank 0's region (refusals included),
 * remote CQ data and a shared fetch-add counter.
 *
 *   fi_emp_peer <rank 0|1> <exchange dir>
 *
 * TAP; each rank ends with "# N passed, M failed", exit 1 on a failure. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

static int rank, passed, failed, numbered;

static void check(int ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s %d - rank %d: ", ok ? "ok" : "not ok", ++numbered, rank);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	ok ? passed++ : failed++;
	fflush(stdout);
}

#define EXPECT(call, want)                                                                               \
	do {                                                                                             \
		long got_ = (long)(call);                                                                \
		check(got_ == (long)(want), "%s == %s (got %ld: %s)", #call, #want, got_,               \
		      got_ < 0 ? fi_strerror((int)-got_) : "");                                          \
	} while (0)

/* A step everything after it needs: on failure, straight to the summary. */
#define REQUIRE(call, want)                                                                              \
	do {                                                                                             \
		long req_ = (long)(call);                                                                \
		check(req_ == (long)(want), "%s == %s (got %ld)", #call, #want, req_);                  \
		if (req_ != (long)(want))                                                                \
			goto done;                                                                       \
	} while (0)

static const char *dir;

/* Publishes bytes under name (atomically: write, then rename). */
static void publish(const char *name, const void *data, size_t len)
{
	char tmp[512], path[512];
	snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(tmp, "wb");
	if (!f || fwrite(data, 1, len, f) != len || fclose(f) || rename(tmp, path)) {
		perror("publish");
		exit(2);
	}
}

/* Waits (up to ~60 s) for the peer's bytes under name. */
static void fetch(const char *name, void *data, size_t len)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(path, "rb");
		if (f) {
			size_t n = fread(data, 1, len, f);
			fclose(f);
			if (n == len)
				return;
		}
		usleep(10000);
	}
	fprintf(stderr, "rank %d: no %s from the peer\n", rank, path);
	exit(2);
}

/* Both ranks reached the same step (over the files, not the NIC). */
static void meet(const char *step)
{
	char mine[128], theirs[128];
	int one = 1;
	snprintf(mine, sizeof mine, "%s.%d", step, rank);
	snprintf(theirs, sizeof theirs, "%s.%d", step, 1 - rank);
	publish(mine, &one, sizeof one);
	fetch(theirs, &one, sizeof one);
}

static struct fid_cq *cq;

static ssize_t next_entry(struct fi_cq_data_entry *e, struct fi_cq_err_entry *err)
{
	for (int i = 0; i < 20000; i++) {
		ssize_t r = fi_cq_read(cq, e, 1);
		if (r == -FI_EAVAIL && err)
			fi_cq_readerr(cq, err, 0);
		if (r != -FI_EAGAIN)
			return r;
		r = fi_cq_sread(cq, e, 0, NULL, 1);
		(void)r;
	}
	return -FI_ETIMEDOUT;
}

static void expect_done(void *ctx, uint64_t flags, const char *what)
{
	struct fi_cq_data_entry e = {0};
	struct fi_cq_err_entry err = {0};
	ssize_t r = next_entry(&e, &err);
	check(r == 1 && e.op_context == ctx && e.flags == flags, "%s completes (ret %zd, flags %#llx, err %d)", what, r,
	      (unsigned long long)e.flags, err.err);
}

#define REGION 65536

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "0") && strcmp(argv[1], "1"))) {
		fprintf(stderr, "usage: fi_emp_peer <0|1> <exchange dir>\n");
		return 2;
	}
	rank = atoi(argv[1]);
	dir = argv[2];
	printf("TAP version 13\n");
	struct fi_info *h = fi_allocinfo(), *info = NULL;
	h->caps = FI_MSG | FI_RMA | FI_ATOMIC | FI_COLLECTIVE;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->fabric_attr->prov_name = strdup("emp");
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info);
	fi_freeinfo(h);
	check(r == 0, "fi_getinfo msg+rma+atomic+collective (%d)", r);
	if (r)
		goto done;
	struct fid_fabric *fabric;
	struct fid_domain *dom;
	struct fid_av *av;
	struct fid_eq *eq;
	struct fid_ep *ep;
	struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_FD};
	struct fi_av_attr aa = {.type = FI_AV_TABLE};
	struct fi_eq_attr ea = {.size = 8, .wait_obj = FI_WAIT_UNSPEC};
	REQUIRE(fi_fabric(info->fabric_attr, &fabric, NULL), 0);
	REQUIRE(fi_domain(fabric, info, &dom, NULL), 0);
	REQUIRE(fi_cq_open(dom, &ca, &cq, NULL), 0);
	REQUIRE(fi_av_open(dom, &aa, &av, NULL), 0);
	REQUIRE(fi_eq_open(fabric, &ea, &eq, NULL), 0);
	REQUIRE(fi_endpoint(dom, info, &ep, NULL), 0);
	REQUIRE(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
	REQUIRE(fi_ep_bind(ep, &av->fid, 0), 0);
	REQUIRE(fi_ep_bind(ep, &eq->fid, 0), 0);
	REQUIRE(fi_enable(ep), 0);

	/* Names, in rank order: fi_addr r is rank r on both sides. */
	uint64_t name[2]; /* EMP names are 8 bytes; fi_av_insert takes them back to back */
	size_t nl = sizeof name[0];
	REQUIRE(fi_getname(&ep->fid, &name[rank], &nl), 0);
	publish(rank ? "name.1" : "name.0", &name[rank], sizeof name[rank]);
	fetch(rank ? "name.0" : "name.1", &name[1 - rank], sizeof name[1 - rank]);
	REQUIRE(fi_av_insert(av, name, 2, NULL, 0, NULL), 2);

	/* Rank 0's region and its key (key + secret). */
	char *region = calloc(1, REGION);
	struct fid_mr *mr;
	REQUIRE(fi_mr_reg(dom, region, REGION, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL), 0);
	uint64_t key = fi_mr_key(mr), peer_key;
	publish(rank ? "key.1" : "key.0", &key, sizeof key);
	fetch(rank ? "key.0" : "key.1", &peer_key, sizeof peer_key);

	/* The group. */
	struct fi_av_set_attr sa = {.count = 2, .flags = FI_UNIVERSE};
	struct fid_av_set *set;
	struct fid_mc *mc;
	REQUIRE(fi_av_set(av, &sa, &set, NULL), 0);
	r = fi_join_collective(ep, FI_ADDR_NOTAVAIL, set, 0, &mc, NULL);
	check(r == 0, "fi_join_collective (%d: %s)", r, fi_strerror(-r));
	if (r)
		goto done; /* nothing below can run without the group */
	uint32_t ev = 0;
	struct fi_eq_entry ent;
	EXPECT(fi_eq_sread(eq, &ev, &ent, sizeof ent, 5000, 0), sizeof ent);
	check(ev == FI_JOIN_COMPLETE, "joined");
	fi_addr_t coll = fi_mc_addr(mc);

	EXPECT(fi_barrier(ep, coll, (void *)1), 0);
	expect_done((void *)1, FI_COLLECTIVE, "fi_barrier across two NICs");
	uint64_t words[8];
	for (int i = 0; i < 8; i++)
		words[i] = rank == 1 ? 0x1000 + (uint64_t)i : 0;
	EXPECT(fi_broadcast(ep, words, 8, NULL, coll, 1, FI_UINT64, 0, (void *)2), 0);
	expect_done((void *)2, FI_COLLECTIVE, "fi_broadcast from rank 1");
	check(words[0] == 0x1000 && words[7] == 0x1007, "the root's words arrived");
	double dv[2] = {1.5 + rank, -rank}, dr[2] = {0, 0};
	EXPECT(fi_allreduce(ep, dv, 2, NULL, dr, NULL, coll, FI_DOUBLE, FI_SUM, 0, (void *)3), 0);
	expect_done((void *)3, FI_COLLECTIVE, "fi_allreduce FI_SUM double");
	check(dr[0] == 4.0 && dr[1] == -1.0, "sums %g %g", dr[0], dr[1]);
	int32_t iv = rank ? 7 : 3, ir = -1;
	EXPECT(fi_reduce(ep, &iv, 1, NULL, &ir, NULL, coll, 0, FI_INT32, FI_MIN, 0, (void *)4), 0);
	expect_done((void *)4, FI_COLLECTIVE, "fi_reduce FI_MIN to rank 0");
	check(rank ? ir == -1 : ir == 3, "the minimum at the root only (%d)", ir);

	/* RMA and atomics: rank 1 acts on rank 0's region across the wire. */
	if (rank == 1) {
		char src[4096];
		for (int i = 0; i < 4096; i++)
			src[i] = (char)(i * 3 + 1);
		EXPECT(fi_write(ep, src, sizeof src, NULL, 0, 1000, peer_key, (void *)5), 0);
		expect_done((void *)5, FI_RMA | FI_WRITE, "fi_write 4 KiB to the other NIC");
		char back[4096] = {0};
		EXPECT(fi_read(ep, back, sizeof back, NULL, 0, 1000, peer_key, (void *)6), 0);
		expect_done((void *)6, FI_RMA | FI_READ, "fi_read it back");
		check(!memcmp(src, back, sizeof src), "read what was written");
		struct fi_cq_data_entry e;
		struct fi_cq_err_entry err = {0};
		EXPECT(fi_write(ep, src, 64, NULL, 0, REGION - 8, peer_key, (void *)7), 0);
		r = (int)next_entry(&e, &err);
		check(r == -FI_EAVAIL && err.err == FI_EACCES, "a write past the region refused across the wire (%d)",
		      err.err);
		EXPECT(fi_write(ep, src, 64, NULL, 0, 0, peer_key ^ (1ULL << 33), (void *)8), 0);
		r = (int)next_entry(&e, &err);
		check(r == -FI_EAVAIL && err.err == FI_EACCES, "a wrong secret refused across the wire (%d)", err.err);
		EXPECT(fi_writedata(ep, src, 16, NULL, 0xD00D, 0, 200, peer_key, (void *)9), 0);
		expect_done((void *)9, FI_RMA | FI_WRITE, "fi_writedata");
	} else {
		struct fi_cq_data_entry e = {0};
		ssize_t n = next_entry(&e, NULL);
		check(n == 1 && e.data == 0xD00D && e.flags == (FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA) && e.len == 16,
		      "remote CQ data from the other NIC (ret %zd, data %#llx)", n, (unsigned long long)e.data);
		int ok = 1;
		for (int i = 0; i < 4096 && ok; i++)
			ok = region[1000 + i] == (char)(i * 3 + 1);
		check(ok && region[REGION - 8] == 0 && region[0] == 0 && region[200] == 1,
		      "rank 0's memory: the writes, not the refused ones");
	}
	uint64_t one = 1, old = 0;
	EXPECT(fi_fetch_atomic(ep, &one, 1, NULL, &old, NULL, 0, 4096 * 8, rank ? peer_key : key, FI_UINT64, FI_SUM,
			       (void *)10),
	       0);
	expect_done((void *)10, FI_ATOMIC | FI_READ, "fi_fetch_atomic on rank 0's counter");
	check(old <= 1, "a distinct old value (%llu)", (unsigned long long)old);
	meet("atomics");
	if (rank == 0)
		check(((uint64_t *)region)[4096] == 2, "both increments landed");

	meet("done");
	EXPECT(fi_close(&mc->fid), 0);
	EXPECT(fi_close(&set->fid), 0);
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&mr->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&av->fid), 0);
	EXPECT(fi_close(&eq->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
	EXPECT(fi_close(&fabric->fid), 0);
	fi_freeinfo(info);
	free(region);
done:
	printf("1..%d\n# %d passed, %d failed\n", numbered, passed, failed);
	return failed ? 1 : 0;
}
