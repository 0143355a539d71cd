/*
 * tierd test guest: boots as a PVH kernel under the patched
 * cloud-hypervisor, drives the per-tier balloon (balloon.c) and runs the
 * phased access workload (workload.c) over the tiers' memory. Serial lines
 * start with "tg "; docs/testguest.md lists them.
 */
#include "arch.h"
#include "balloon.h"
#include "cmdline.h"
#include "console.h"
#include "mem.h"
#include "vmem.h"
#include "workload.h"

static struct tg_params params;

/* CMOS RTC seconds register: changes once a second, our only wall clock. */
static uint8_t rtc_seconds(void)
{
	outb(0x70, 0x00);
	return inb(0x71);
}

static void print_list(const char *key, const uint64_t *v, unsigned n)
{
	con_printf(" %s=", key);
	for (unsigned i = 0; i < n; i++)
		con_printf(i ? ",%lu" : "%lu", v[i]);
}

static void print_weights(const struct tg_phase *ph, unsigned nsets)
{
	con_puts(" w=");
	for (unsigned j = 0; j < nsets; j++)
		con_printf(j ? "/%u" : "%u", ph->weight[j]);
	con_puts(" active=");
	for (unsigned j = 0; j < nsets; j++)
		con_printf(j ? "/%u" : "%u", wl.active[j]);
}

static void print_state(void)
{
	uint64_t v[VIRTIO_BALLOON_TIERS_MAX];
	uint32_t res[VIRTIO_BALLOON_TIERS_MAX];

	/* acc, res and lost per tier; bal and free per zone. */
	print_list("acc", wl.t.acc, ntiers);
	for (unsigned i = 0; i < nzones; i++)
		v[i] = zones[i].ballooned;
	print_list("bal", v, nzones);
	for (unsigned i = 0; i < nzones; i++)
		v[i] = zones[i].free;
	print_list("free", v, nzones);
	wl_resident(res);
	for (unsigned i = 0; i < ntiers; i++)
		v[i] = res[i];
	print_list("res", v, ntiers);
	print_list("lost", wl.t.lost, ntiers);
	con_printf(" stats=%lu\n", balloon_stats_updates());
}

/* TSC kHz from the hypervisor's timing leaf (cloud-hypervisor fills it from
 * KVM), 0 when there is none. */
static uint32_t tsc_khz(void)
{
	uint32_t a, b, c, d;

	cpuid(0x40000000, &a, &b, &c, &d);
	if (a < 0x40000010)
		return 0;
	cpuid(0x40000010, &a, &b, &c, &d);
	return a;
}

static void start_phase(unsigned n)
{
	const struct tg_phase *ph = &params.phase[n];

	wl_set_phase(ph);
	wl.t.phase = n;
	if (params.quiet)
		return;
	con_printf("tg phase n=%u", n);
	print_weights(ph, params.nsets);
	con_printf(" len=%lu%s at=%lu", ph->len, ph->seconds ? "s" : "", wl.t.total);
	print_list("acc", wl.t.acc, ntiers);
	con_puts("\n");
}

/* deaf= and lie= windows: switch the driver's mode at their edges (second `s`). */
static void windows(unsigned s)
{
	static int deaf, lie;
	int d = tg_window_in(params.deaf, params.ndeaf, s);
	int l = tg_window_in(params.lie, params.nlie, s);

	if (d != deaf) {
		deaf = d;
		balloon_set_deaf(d);
		con_printf("tg deaf %s s=%u\n", d ? "on" : "off", s);
	}
	if (l != lie) {
		lie = l;
		balloon_set_lie(l);
		con_printf("tg lie %s s=%u\n", l ? "on" : "off", s);
	}
}

void tg_main(uint32_t start_info);

void tg_main(uint32_t start_info)
{
	const struct hvm_start_info *si = (const void *)(uint64_t)start_info;
	const char *cmdline = "";
	struct tg_balloon_cfg cfg;
	struct tg_vmem_region vr;
	unsigned phase = 0, seconds = 0;
	uint64_t phase_left, report_left, budget_left;
	uint8_t sec;
	int done = 0, stay = 0;

	con_puts("tg boot tierd-testguest\n");
	if (si->magic != HVM_START_MAGIC)
		die("start_info magic %x", si->magic);
	if (si->cmdline_paddr)
		cmdline = (const char *)si->cmdline_paddr;
	con_printf("tg cmdline %s\n", cmdline);
	tg_params_default(&params);
	if (tg_params_parse(cmdline, &params))
		die("cmdline: %s", params.err);

	balloon_probe(&cfg);
	vmem_probe(params.vmem, &vr);
	mem_init(si, &cfg, &vr, balloon_mem_need() + vmem_mem_need() + wl_mem_need(&params));
	for (unsigned i = 0; i < nzones; i++) {
		con_printf("tg zone i=%u start=0x%lx span=%u total=%u free=%u node=%d tier=%u\n", i,
			   zones[i].base_pfn << PAGE_SHIFT, zones[i].span, zones[i].total,
			   zones[i].free, (int)zones[i].node, zones[i].tier);
	}
	for (unsigned j = 0; j < params.nsets; j++)
		if (params.hot[j] && j >= ntiers)
			die("cmdline: hot set %u wants tier %u, the VM has %u tier(s)", j, j, ntiers);
	wl_init(&params);
	for (unsigned i = 0; i < nzones; i++) {
		wl.t.stamp_gpa[i] = (uint64_t)zones[i].stamp;
		wl.t.stamp_pfn[i] = zones[i].base_pfn;
		wl.t.stamp_pages[i] = zones[i].stamp ? zones[i].span : 0;
	}
	if (params.rate) {
		uint32_t khz = tsc_khz();

		if (!khz)
			die("cmdline: rate= needs the TSC frequency (CPUID 0x40000010), none here");
		wl_pace(params.rate, khz);
	}
	balloon_start();
	vmem_start();
	con_printf("tg ready tiers=%u sets=%u phases=%u truth=0x%lx\n", ntiers, params.nsets,
		   params.nphases, (uint64_t)&wl.t);

	start_phase(0);
	phase_left = params.phase[0].len;
	report_left = params.report;
	budget_left = params.accesses;
	sec = rtc_seconds();
	windows(0);
	for (;;) {
		uint64_t n = params.poll;
		const struct tg_phase *ph = &params.phase[phase];
		uint64_t len = stay ? 0 : ph->len; /* 0: this phase never ends */
		int by_acc = len && !ph->seconds, by_sec = len && ph->seconds;
		uint8_t now;

		if (!done) {
			if (by_acc && phase_left < n)
				n = phase_left;
			if (!params.report_seconds && params.report && report_left < n)
				n = report_left;
			if (params.accesses && budget_left < n)
				n = budget_left;
			wl_run(n);
			if (by_acc)
				phase_left -= n;
			if (!params.report_seconds && params.report && !(report_left -= n)) {
				report_left = params.report;
				con_printf("tg tick s=%u phase=%u total=%lu", seconds, phase, wl.t.total);
				print_state();
			}
			if (params.accesses && !(budget_left -= n)) {
				done = 1;
				con_printf("tg done total=%lu", wl.t.total);
				print_state();
			}
		}
		balloon_poll();
		vmem_poll(seconds);

		now = rtc_seconds();
		if (now != sec) {
			sec = now;
			seconds++;
			wl.t.seconds = seconds;
			windows(seconds);
			if (by_sec)
				phase_left--;
			if (params.report_seconds && params.report && seconds % params.report == 0) {
				con_printf("tg tick s=%u phase=%u total=%lu", seconds, phase, wl.t.total);
				print_state();
			}
		}
		if (done || !len || phase_left)
			continue;
		if (phase + 1 < params.nphases) {
			phase++;
		} else if (params.loop) {
			phase = 0;
		} else {
			stay = 1; /* keep the last phase's weights for good */
			if (params.quiet)
				continue;
			con_printf("tg phase n=%u stays at=%lu", phase, wl.t.total);
			print_list("acc", wl.t.acc, ntiers);
			con_puts("\n");
			continue;
		}
		phase_left = params.phase[phase].len;
		start_phase(phase);
	}
}
