/* x86_64 helpers for the freestanding guest: port I/O, MMIO, barriers. */
#ifndef TG_ARCH_H
#define TG_ARCH_H

#include <stddef.h>
#include <stdint.h>

static inline void outb(uint16_t port, uint8_t v)
{
	__asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port));
}

static inline uint8_t inb(uint16_t port)
{
	uint8_t v;

	__asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

static inline void outl(uint16_t port, uint32_t v)
{
	__asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port));
}

static inline uint32_t inl(uint16_t port)
{
	uint32_t v;

	__asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

static inline uint8_t mmio_r8(uint64_t a)
{
	return *(volatile uint8_t *)a;
}

static inline uint16_t mmio_r16(uint64_t a)
{
	return *(volatile uint16_t *)a;
}

static inline uint32_t mmio_r32(uint64_t a)
{
	return *(volatile uint32_t *)a;
}

static inline void mmio_w8(uint64_t a, uint8_t v)
{
	*(volatile uint8_t *)a = v;
}

static inline void mmio_w16(uint64_t a, uint16_t v)
{
	*(volatile uint16_t *)a = v;
}

static inline void mmio_w32(uint64_t a, uint32_t v)
{
	*(volatile uint32_t *)a = v;
}

/* Order ring writes before the index that publishes them (and vice versa). */
static inline void mb(void)
{
	__asm__ volatile("mfence" ::: "memory");
}

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
}

static inline void cpuid(uint32_t leaf, uint32_t *a, uint32_t *b, uint32_t *c, uint32_t *d)
{
	__asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(0));
}

static inline void cpu_relax(void)
{
	__asm__ volatile("pause" ::: "memory");
}

static inline __attribute__((noreturn)) void halt_forever(void)
{
	for (;;)
		__asm__ volatile("cli; hlt");
}

#define PAGE_SIZE 4096ULL
#define PAGE_SHIFT 12

void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);

#endif
