/*
 * PVH entry: cloud-hypervisor jumps to _start32 (XEN_ELFNOTE_PHYS32_ENTRY)
 * in 32-bit protected mode, paging off, %ebx = hvm_start_info. We identity-
 * map the low 4 GiB with 2 MiB pages, enter long mode and call
 * tg_main(start_info). paging.c maps anything above 4 GiB on demand.
 */
	.section .note.pvh, "a"
	.align 4
	.long 4			/* namesz: "Xen\0" */
	.long 4			/* descsz */
	.long 18		/* XEN_ELFNOTE_PHYS32_ENTRY */
	.asciz "Xen"
	.long _start32

	.section .text.boot, "ax"
	.code32
	.globl _start32
_start32:
	cli
	cld
	movl %ebx, start_info_paddr
	movl $boot_stack_top, %esp

	/* Zero the 6 table pages (fresh guest RAM is zero, but be exact). */
	movl $boot_pml4, %edi
	xorl %eax, %eax
	movl $(6 * 4096 / 4), %ecx
	rep stosl

	/* PML4[0] -> PDPT, PDPT[0..3] -> 4 PDs. */
	movl $boot_pdpt, %eax
	orl $3, %eax
	movl %eax, boot_pml4
	movl $boot_pd, %eax
	orl $3, %eax
	movl $boot_pdpt, %edi
	movl $4, %ecx
1:	movl %eax, (%edi)
	addl $4096, %eax
	addl $8, %edi
	loop 1b

	/* 2048 2 MiB pages: present, writable, PS; entry j maps j << 21. */
	movl $boot_pd, %edi
	xorl %ebx, %ebx		/* j */
2:	movl %ebx, %eax
	shll $21, %eax
	orl $0x83, %eax
	movl %eax, (%edi)
	movl %ebx, %eax
	shrl $11, %eax		/* high dword: j >> 11 */
	movl %eax, 4(%edi)
	addl $8, %edi
	incl %ebx
	cmpl $2048, %ebx
	jne 2b

	movl %cr4, %eax
	orl $(1 << 5), %eax	/* PAE */
	movl %eax, %cr4
	movl $boot_pml4, %eax
	movl %eax, %cr3
	movl $0xc0000080, %ecx	/* EFER */
	rdmsr
	orl $(1 << 8), %eax	/* LME */
	wrmsr
	movl %cr0, %eax
	orl $((1 << 31) | 1), %eax	/* PG | PE */
	movl %eax, %cr0
	lgdt gdt_ptr
	ljmp $0x08, $start64

	.code64
start64:
	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %ss
	xorw %ax, %ax
	movw %ax, %fs
	movw %ax, %gs
	movq $boot_stack_top, %rsp
	movl start_info_paddr, %edi
	call tg_main
3:	cli
	hlt
	jmp 3b

	.section .rodata
	.align 8
gdt:
	.quad 0
	.quad 0x00af9a000000ffff	/* 0x08: 64-bit code */
	.quad 0x00cf92000000ffff	/* 0x10: data */
gdt_end:
gdt_ptr:
	.word gdt_end - gdt - 1
	.long gdt

	.section .data
	.align 4
start_info_paddr:
	.long 0

	.section .bss
	.align 4096
	.globl boot_pml4
boot_pml4:
	.skip 4096
boot_pdpt:
	.skip 4096
	.globl boot_pd
boot_pd:
	.skip 4 * 4096
boot_stack:
	.skip 16384
boot_stack_top:
