/* PVH guest for profiler/tests/ch_live.rs: writes a marker into each of
 * two memory zones, prints "tierd-zones" on COM1 and halts. Entered in
 * 32-bit protected mode without paging (PVH), so guest-physical addresses
 * are used as they are. SLOW_BASE (-DSLOW_BASE=...) is the first
 * guest-physical address of the second zone.
 * Build: cc -c -m64 -DSLOW_BASE=0x8000000 zone_marker.S && ld -m elf_x86_64 -Ttext=0x100000 */
        .section .note.pvh, "a"
        .align 4
        .long 4                 /* namesz: "Xen\0" */
        .long 4                 /* descsz */
        .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
        .asciz "Xen"
        .long _start

        .text
        .code32
        .globl _start
_start:
        movl $0x72656974, 0x200000              /* "tier" */
        movl $0x4d415244, 0x200004              /* "DRAM" */
        movl $0x72656974, SLOW_BASE + 0x1000    /* "tier" */
        movl $0x574f4c53, SLOW_BASE + 0x1004    /* "SLOW" */
        mov $msg, %esi
        mov $0x3f8, %dx
1:      lodsb
        test %al, %al
        jz 2f
        out %al, %dx
        jmp 1b
2:      hlt
        jmp 2b

        .section .rodata
msg:    .asciz "tierd-zones\n"
