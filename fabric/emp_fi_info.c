/* libemp-fi.so, the libfabric provider "emp": fi_getinfo and the provider's
 * entry point. See emp_fi.h and fabric/README.md. */

#include "emp_fi.h"

/* ---- fi_getinfo ------------------------------------------------------------------ */

/* "fi_emp://N:P" or "N:P" -> an address. */
static int parse_node(const char *s, struct emp_fi_name *n)
{
	unsigned node, port;
	char extra;
	if (!strncmp(s, "fi_emp://", 9))
		s += 9;
	if (sscanf(s, "%u:%u%c", &node, &port, &extra) != 2 || node >= EMP_ANY_NODE || port >= EMP_ANY_PORT)
		return -1;
	n->node = (uint16_t)node;
	n->port = (uint16_t)port;
	n->magic = ADDR_MAGIC;
	return 0;
}

/* Everything in the hints EMP cannot do: the first such hint, or NULL. */
static const char *hints_refused(uint32_t version, const struct fi_info *h, const struct emp_port_info *pi)
{
	if (!h)
		return NULL;
	if (h->caps & ~(uint64_t)EMP_CAPS)
		return "h->caps & ~(uint64_t)EMP_CAPS";
	if (h->addr_format != FI_FORMAT_UNSPEC)
		return "h->addr_format != FI_FORMAT_UNSPEC";
	if (h->ep_attr) {
		const struct fi_ep_attr *e = h->ep_attr;
		if (e->type != FI_EP_UNSPEC && e->type != FI_EP_RDM)
			return "e->type != FI_EP_UNSPEC && e->type != FI_EP_RDM";
		if (e->protocol != FI_PROTO_UNSPEC || e->max_msg_size > pi->msg_max || e->auth_key_size)
			return "e->protocol != FI_PROTO_UNSPEC || e->max_msg_size > pi->msg_max || e->auth_key_size";
		if (e->tx_ctx_cnt > 1 || e->rx_ctx_cnt > 1)
			return "e->tx_ctx_cnt > 1 || e->rx_ctx_cnt > 1";
		if (e->msg_prefix_size || e->max_order_raw_size || e->max_order_war_size || e->max_order_waw_size)
			return "e->msg_prefix_size || e->max_order_raw_size || e->max_order_war_size || e->max_order_waw_size";
		bool both = (h->caps & FI_MSG) && (h->caps & FI_TAGGED);
		if (both && (e->mem_tag_format & MSG_TAG_BIT))
			return "both && (e->mem_tag_format & MSG_TAG_BIT)";
	}
	if (h->domain_attr) {
		const struct fi_domain_attr *d = h->domain_attr;
		if (d->name && strcmp(d->name, EMP_FI_NAME))
			return "d->name && strcmp(d->name, EMP_FI_NAME)";
		if (d->auth_key_size)
			return "domain auth_key";
		if (d->cq_data_size > CQ_DATA_SIZE)
			return "cq_data_size > 4";
		if (d->ep_cnt > 1 || d->tx_ctx_cnt > 1 || d->rx_ctx_cnt > 1)
			return "domain ep_cnt/tx_ctx_cnt/rx_ctx_cnt > 1 (one endpoint per domain)";
		if (d->max_ep_stx_ctx || d->max_ep_srx_ctx || d->mr_iov_limit > 1)
			return "d->max_ep_stx_ctx || d->max_ep_srx_ctx || d->mr_iov_limit > 1";
		if (FI_VERSION_GE(version, FI_VERSION(1, 5)) && (d->caps & ~(uint64_t)EMP_CAPS))
			return "FI_VERSION_GE(version, FI_VERSION(1, 5)) && (d->caps & ~(uint64_t)EMP_CAPS)";
		if (FI_VERSION_LT(version, FI_VERSION(1, 5)) && d->mr_mode == FI_MR_SCALABLE)
			return "FI_VERSION_LT(version, FI_VERSION(1, 5)) && d->mr_mode == FI_MR_SCALABLE";
		if (d->av_type != FI_AV_UNSPEC && d->av_type != FI_AV_MAP && d->av_type != FI_AV_TABLE)
			return "d->av_type != FI_AV_UNSPEC && d->av_type != FI_AV_MAP && d->av_type != FI_AV_TABLE";
	}
	if (h->fabric_attr && h->fabric_attr->name && strcmp(h->fabric_attr->name, EMP_FI_NAME))
		return "h->fabric_attr && h->fabric_attr->name && strcmp(h->fabric_attr->name, EMP_FI_NAME)";
	if (h->tx_attr) {
		const struct fi_tx_attr *t = h->tx_attr;
		if ((t->caps & ~(uint64_t)EMP_CAPS) || (t->op_flags & ~tx_op_flags_ok(h->caps)))
			return "tx caps beyond EMP's, or tx op_flags EMP cannot promise (FI_DELIVERY_COMPLETE with messages)";
		if ((t->msg_order & ~FI_ORDER_SAS) || t->comp_order != FI_ORDER_NONE)
			return "(t->msg_order & ~FI_ORDER_SAS) || t->comp_order != FI_ORDER_NONE";
		if (t->inject_size > INJECT_SIZE || t->size > pi->send_entries || t->iov_limit > 1 || t->rma_iov_limit > 1)
			return "t->inject_size > INJECT_SIZE || t->size > pi->send_entries || t->iov_limit > 1 || t->rma_iov_limit > 1";
	}
	if (h->rx_attr) {
		const struct fi_rx_attr *r = h->rx_attr;
		if ((r->caps & ~(uint64_t)EMP_CAPS) || (r->op_flags & ~(uint64_t)EMP_RX_OP_FLAGS))
			return "(r->caps & ~(uint64_t)EMP_CAPS) || (r->op_flags & ~(uint64_t)EMP_RX_OP_FLAGS)";
		if ((r->msg_order & ~FI_ORDER_SAS) || r->comp_order != FI_ORDER_NONE)
			return "(r->msg_order & ~FI_ORDER_SAS) || r->comp_order != FI_ORDER_NONE";
		if (r->total_buffered_recv || r->size > pi->recv_entries || r->iov_limit > 1)
			return "r->total_buffered_recv || r->size > pi->recv_entries || r->iov_limit > 1";
	}
	if (h->caps & (FI_RMA | FI_ATOMIC)) {
		/* Remote addresses are offsets and keys the NIC's: a caller that
		 * must pick keys, or an API before 1.5 (FI_MR_BASIC: virtual
		 * addresses), cannot use EMP's RMA. */
		if (FI_VERSION_LT(version, FI_VERSION(1, 5)))
			return "FI_RMA before API 1.5 (FI_MR_BASIC addresses are virtual)";
		if (h->domain_attr && (h->domain_attr->mr_mode == FI_MR_BASIC || h->domain_attr->mr_mode == FI_MR_SCALABLE))
			return "FI_RMA with FI_MR_BASIC/FI_MR_SCALABLE (virtual addresses or caller keys)";
		if (h->domain_attr && h->domain_attr->mr_mode != FI_MR_UNSPEC && !(h->domain_attr->mr_mode & FI_MR_PROV_KEY))
			return "FI_RMA without FI_MR_PROV_KEY (keys are the NIC's)";
		if (h->domain_attr && h->domain_attr->mr_key_size > sizeof(uint64_t))
			return "mr_key_size > 8";
	}
	if (h->src_addr && h->src_addrlen != sizeof(struct emp_fi_name))
		return "h->src_addr && h->src_addrlen != sizeof(struct emp_fi_name)";
	if (h->dest_addr && h->dest_addrlen != sizeof(struct emp_fi_name))
		return "h->dest_addr && h->dest_addrlen != sizeof(struct emp_fi_name)";
	return NULL;
}

static int emp_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
		       const struct fi_info *hints, struct fi_info **info)
{
	(void)service;
	struct emp_port_info pi;
	if (!info)
		return -FI_EINVAL;
	int nic = query_nic(&pi);
	if (nic) {
		FI_INFO(&emp_prov, FI_LOG_CORE, "no EMP NIC for this process: %s\n", strerror(-nic));
		return -FI_ENODATA;
	}
	const char *why = hints_refused(version, hints, &pi);
	if (why) {
		FI_INFO(&emp_prov, FI_LOG_CORE, "hints refused: %s\n", why);
		return -FI_ENODATA;
	}
	struct emp_fi_name dest;
	bool have_dest = false;
	if (node && !(flags & FI_SOURCE)) {
		if (parse_node(node, &dest))
			return -FI_ENODATA;
		have_dest = true;
	} else if (hints && hints->dest_addr) {
		memcpy(&dest, hints->dest_addr, sizeof dest);
		if (dest.magic != ADDR_MAGIC)
			return -FI_ENODATA;
		have_dest = true;
	}
	uint64_t asked = hints ? hints->caps : 0;
	uint64_t caps = asked & (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_COLLECTIVE);
	if (!(caps & (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_COLLECTIVE)))
		caps |= FI_MSG | FI_TAGGED;
	if (!asked)
		caps |= FI_RMA | FI_ATOMIC | FI_COLLECTIVE; /* no hints: everything there is */
	caps |= asked & EMP_DIR_CAPS;
	caps |= asked ? asked & EMP_SECONDARY_CAPS : EMP_SECONDARY_CAPS;
	bool both = (caps & FI_MSG) && (caps & FI_TAGGED);
	if (hints && hints->domain_attr && hints->domain_attr->cq_data_size && !cq_data_ok(caps)) {
		FI_INFO(&emp_prov, FI_LOG_CORE,
			"hints refused: cq_data_size with FI_RMA and FI_TAGGED (remote CQ data needs one of them)\n");
		return -FI_ENODATA;
	}

	struct fi_info *fi = fi_allocinfo();
	if (!fi)
		return -FI_ENOMEM;
	fi->caps = caps;
	fi->mode = 0; /* EMP needs no FI_CONTEXT, prefix, or local MR mode bit */
	fi->addr_format = FI_FORMAT_UNSPEC;
	if (have_dest) {
		fi->dest_addr = malloc(sizeof dest);
		if (!fi->dest_addr) {
			fi_freeinfo(fi);
			return -FI_ENOMEM;
		}
		memcpy(fi->dest_addr, &dest, sizeof dest);
		fi->dest_addrlen = sizeof dest;
	}
	const struct fi_tx_attr *ht = hints ? hints->tx_attr : NULL;
	const struct fi_rx_attr *hr = hints ? hints->rx_attr : NULL;
	const struct fi_domain_attr *hd = hints ? hints->domain_attr : NULL;

	fi->tx_attr->caps = caps;
	fi->tx_attr->op_flags = ht ? ht->op_flags : 0;
	fi->tx_attr->msg_order = FI_ORDER_SAS; /* EMP delivers in order per peer */
	fi->tx_attr->comp_order = FI_ORDER_NONE;
	fi->tx_attr->inject_size = INJECT_SIZE;
	fi->tx_attr->size = pi.send_entries;
	fi->tx_attr->iov_limit = 1;
	fi->tx_attr->rma_iov_limit = (caps & (FI_RMA | FI_ATOMIC)) ? 1 : 0;

	fi->rx_attr->caps = caps;
	fi->rx_attr->op_flags = hr ? hr->op_flags : 0;
	fi->rx_attr->msg_order = FI_ORDER_SAS;
	fi->rx_attr->comp_order = FI_ORDER_NONE;
	fi->rx_attr->total_buffered_recv = 0; /* unexpected messages wait at the sender */
	fi->rx_attr->size = pi.recv_entries;
	fi->rx_attr->iov_limit = 1;

	fi->ep_attr->type = FI_EP_RDM;
	fi->ep_attr->protocol = FI_PROTO_UNSPEC;
	fi->ep_attr->protocol_version = 1;
	fi->ep_attr->max_msg_size = pi.msg_max;
	fi->ep_attr->mem_tag_format = both ? ~MSG_TAG_BIT : ~0ULL;
	fi->ep_attr->tx_ctx_cnt = 1;
	fi->ep_attr->rx_ctx_cnt = 1;

	struct fi_domain_attr *d = fi->domain_attr;
	d->name = strdup(EMP_FI_NAME);
	d->threading = hd && hd->threading != FI_THREAD_UNSPEC ? hd->threading : FI_THREAD_SAFE;
	/* The NIC runs the protocol: transfers progress without the caller. */
	d->control_progress = hd && hd->control_progress != FI_PROGRESS_UNSPEC ? hd->control_progress : FI_PROGRESS_AUTO;
	d->data_progress = hd && hd->data_progress != FI_PROGRESS_UNSPEC ? hd->data_progress : FI_PROGRESS_AUTO;
	d->resource_mgmt = hd && hd->resource_mgmt != FI_RM_UNSPEC ? hd->resource_mgmt : FI_RM_ENABLED;
	d->av_type = hd ? hd->av_type : FI_AV_UNSPEC;
	if (FI_VERSION_LT(version, FI_VERSION(1, 5))) {
		d->mr_mode = FI_MR_BASIC;
	} else if (!hd) {
		d->mr_mode = EMP_MR_MODES;
	} else if (hd->mr_mode == FI_MR_BASIC) {
		d->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	} else {
		/* EMP needs none of them for messages (unregistered memory is
		 * bounced or registered per operation); offered ones are kept
		 * so the caller's registrations give zero copy. */
		d->mr_mode = hd->mr_mode & EMP_MR_MODES;
	}
	/* Remote addresses are offsets into the region. */
	if (caps & (FI_RMA | FI_ATOMIC))
		d->mr_mode = (d->mr_mode & ~FI_MR_VIRT_ADDR) | FI_MR_PROV_KEY;
	/* fi_mr_key is EMP's remote key, the region's key and its secret. */
	d->mr_key_size = sizeof(uint64_t);
	d->cq_data_size = cq_data_ok(caps) ? CQ_DATA_SIZE : 0;
	d->cq_cnt = 64;
	d->ep_cnt = 1;
	d->tx_ctx_cnt = 1;
	d->rx_ctx_cnt = 1;
	d->max_ep_tx_ctx = 1;
	d->max_ep_rx_ctx = 1;
	d->max_ep_stx_ctx = 0;
	d->max_ep_srx_ctx = 0;
	d->cntr_cnt = 64;
	d->mr_iov_limit = 1;
	d->caps = FI_LOCAL_COMM | FI_REMOTE_COMM;
	d->mode = 0;
	d->max_err_data = 0;

	fi->fabric_attr->name = strdup(EMP_FI_NAME);
	/* prov_name: the core fills it in (it would append to ours). */
	fi->fabric_attr->prov_version = EMP_FI_PROV_VERSION;
	fi->fabric_attr->api_version = FI_VERSION(1, 17);
	if (!d->name || !fi->fabric_attr->name) {
		fi_freeinfo(fi);
		return -FI_ENOMEM;
	}
	*info = fi;
	return 0;
}

static void emp_cleanup(void)
{
}

struct fi_provider emp_prov = {
	.version = EMP_FI_PROV_VERSION,
	.fi_version = FI_VERSION(1, 17),
	.name = EMP_FI_NAME,
	.getinfo = emp_getinfo,
	.fabric = fabric_open,
	.cleanup = emp_cleanup,
};

__attribute__((visibility("default"))) FI_EXT_INI
{
	return &emp_prov;
}
