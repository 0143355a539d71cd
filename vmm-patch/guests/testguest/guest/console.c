/*
 * COM1 (0x3f8) output. cloud-hypervisor's 16550 takes a byte whenever it is
 * written, so the line-status register is not polled: every port access is
 * a VM exit, and halving them matters under emulation.
 */
#include <stdarg.h>
#include <stdint.h>

#include "arch.h"
#include "console.h"

#define COM1 0x3f8

static void putc_raw(char c)
{
	outb(COM1, (uint8_t)c);
}

void con_puts(const char *s)
{
	while (*s)
		putc_raw(*s++);
}

static void put_num(uint64_t v, unsigned base, int neg, unsigned width, char pad)
{
	char buf[24];
	unsigned n = 0;

	do {
		unsigned d = (unsigned)(v % base);

		buf[n++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
		v /= base;
	} while (v);
	if (neg)
		buf[n++] = '-';
	while (width > n) {
		putc_raw(pad);
		width--;
	}
	while (n)
		putc_raw(buf[--n]);
}

static void vprint(const char *fmt, va_list ap)
{
	for (; *fmt; fmt++) {
		unsigned width = 0, lng = 0;
		char pad = ' ';
		uint64_t u;
		int64_t s;

		if (*fmt != '%') {
			putc_raw(*fmt);
			continue;
		}
		fmt++;
		if (*fmt == '0') {
			pad = '0';
			fmt++;
		}
		while (*fmt >= '0' && *fmt <= '9')
			width = width * 10 + (unsigned)(*fmt++ - '0');
		while (*fmt == 'l') {
			lng++;
			fmt++;
		}
		switch (*fmt) {
		case 's': {
			const char *str = va_arg(ap, const char *);

			con_puts(str ? str : "(null)");
			break;
		}
		case 'c':
			putc_raw((char)va_arg(ap, int));
			break;
		case 'd':
			s = lng ? va_arg(ap, int64_t) : va_arg(ap, int);
			put_num(s < 0 ? (uint64_t)-s : (uint64_t)s, 10, s < 0, width, pad);
			break;
		case 'u':
		case 'x':
			u = lng ? va_arg(ap, uint64_t) : va_arg(ap, unsigned);
			put_num(u, *fmt == 'u' ? 10 : 16, 0, width, pad);
			break;
		case '%':
			putc_raw('%');
			break;
		default:
			putc_raw('?');
			if (!*fmt)
				return;
		}
	}
}

void con_printf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprint(fmt, ap);
	va_end(ap);
}

void die(const char *fmt, ...)
{
	va_list ap;

	con_puts("tg error ");
	va_start(ap, fmt);
	vprint(fmt, ap);
	va_end(ap);
	con_puts("\ntg halted\n");
	halt_forever();
}
