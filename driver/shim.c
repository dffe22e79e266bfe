// SPDX-License-Identifier: GPL-2.0
/*
 * Static inlines emp.ko needs that have no Rust binding in 7.3
 * (docs/kernel.md: "the escape hatch for static inlines"), and the
 * NIC's MSI-X vector setup (see irq.rs for why it is here).
 */
#include <linux/eventfd.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>

/* Called from Rust only (extern "C" blocks in port.rs, mr.rs, irq.rs). */
phys_addr_t emp_page_to_phys(struct page *page);
struct mm_struct *emp_current_mm_grab(void);
void emp_mmdrop(struct mm_struct *mm);
void __iomem *emp_ioremap(phys_addr_t start, size_t len);
void emp_iounmap(void __iomem *base);
u32 emp_readl(void __iomem *base, size_t off);
void emp_writel(void __iomem *base, size_t off, u32 v);
int emp_irq_setup(struct device *dev, void *cookie, irqreturn_t (*thread)(int, void *));
void emp_irq_teardown(struct device *dev, int irq, void *cookie);
void emp_eventfd_signal(struct eventfd_ctx *ctx);
pid_t emp_current_tgid(void);
void emp_vma_window(struct vm_area_struct *vma);
/* In Rust (port.rs). */
vm_fault_t emp_window_fault(void *port, struct vm_area_struct *vma, unsigned long address, unsigned long pgoff);

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

/*
 * One MSI-X vector with a threaded handler (the handler takes a mutex).
 * Returns the Linux IRQ number, or a negative errno (no MSI-X: e.g. the
 * guest has ivshmem-plain, which has no interrupts).
 */
int emp_irq_setup(struct device *dev, void *cookie, irqreturn_t (*thread)(int, void *))
{
	struct pci_dev *pdev = to_pci_dev(dev);
	int irq, ret;

	ret = pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_MSIX);
	if (ret < 0)
		return ret;
	irq = pci_irq_vector(pdev, 0);
	if (irq < 0) {
		pci_free_irq_vectors(pdev);
		return irq;
	}
	ret = request_threaded_irq(irq, NULL, thread, IRQF_ONESHOT, "emp", cookie);
	if (ret) {
		pci_free_irq_vectors(pdev);
		return ret;
	}
	return irq;
}

/* Waits for a running handler, then frees the vector. */
void emp_irq_teardown(struct device *dev, int irq, void *cookie)
{
	free_irq(irq, cookie);
	pci_free_irq_vectors(to_pci_dev(dev));
}

/* eventfd_signal is a static inline. */
void emp_eventfd_signal(struct eventfd_ctx *ctx)
{
	eventfd_signal(ctx);
}

/* The calling process's pid in the initial pid namespace (what GANG names). */
pid_t emp_current_tgid(void)
{
	return task_tgid_nr(current);
}

/*
 * A port window is filled on fault, from the slot its port holds at that
 * moment (emp_window_fault), so a context switch can take it away
 * (unmap_mapping_range) and a restore give it back. Rust 7.3 has no
 * vm_operations_struct binding, nor a way to set VM_PFNMAP.
 */
static vm_fault_t emp_vm_fault(struct vm_fault *vmf)
{
	return emp_window_fault(vmf->vma->vm_file->private_data, vmf->vma, vmf->address, vmf->pgoff);
}

static const struct vm_operations_struct emp_window_ops = {
	.fault = emp_vm_fault,
};

void emp_vma_window(struct vm_area_struct *vma)
{
	vma->vm_ops = &emp_window_ops;
	vm_flags_set(vma, VM_PFNMAP | VM_DONTDUMP);
}
