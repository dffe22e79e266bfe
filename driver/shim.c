// SPDX-License-Identifier: GPL-2.0
/*
 * Static inlines emp.ko needs that have no Rust binding in 7.3
 * (../shared/KERNEL.md: "the escape hatch for static inlines").
 */
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>

phys_addr_t emp_page_to_phys(struct page *page)
{
	return page_to_phys(page);
}

/* current->mm with a reference (mmgrab), or NULL for kernel threads. */
struct mm_struct *emp_current_mm_grab(void)
{
	struct mm_struct *mm = current->mm;

	if (mm)
		mmgrab(mm);
	return mm;
}

void emp_mmdrop(struct mm_struct *mm)
{
	mmdrop(mm);
}

void __iomem *emp_ioremap(phys_addr_t start, size_t len)
{
	return ioremap(start, len);
}

void emp_iounmap(void __iomem *base)
{
	iounmap(base);
}

u32 emp_readl(void __iomem *base, size_t off)
{
	return readl(base + off);
}

void emp_writel(void __iomem *base, size_t off, u32 v)
{
	writel(v, base + off);
}
