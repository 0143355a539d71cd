/* SPDX-License-Identifier: GPL-2.0-or-later */
/*
 * tier_truth: exact per-page access truth for the Linux bed (docs/linux-bed.md).
 * A QEMU 7.2 TCG plugin (API v1). For every guest load and store it counts,
 * per guest-physical 4 KiB page of the given RAM backends, the accesses and
 * those that miss a shared last-level-cache model (set-associative LRU on
 * 64-byte lines, sets indexed by a hash of the line, as benches' twin LLC);
 * it also counts executed guest instructions. Instruction fetches and the
 * MMU's page-table walks are not memory callbacks in TCG: not counted.
 *
 * Arguments (-plugin tier_truth.so,KEY=VALUE,...):
 *   out=PATH         shared-memory file to create (e.g. /dev/shm/NAME)
 *   ram=GPA:FILE     a memory-backend-file whose mem-path is FILE and whose
 *                    offset 0 sits at guest-physical GPA; repeatable (<= 16)
 *   llc_kib=N        LLC size in KiB (default 32768 = 32 MiB)
 *   llc_ways=N       LLC ways (default 16)
 *
 * Why files: qemu_plugin_hwaddr_phys_addr() in 7.2 returns
 * block->offset + offset + block->mr->addr, i.e. the RAMBlock's ram_addr
 * plus the region's address inside its *parent* container. That equals the
 * GPA only for node 0's backend; for m1 it is GPA + 256 MiB and for a
 * virtio-mem device ram_addr + (memaddr - device-memory base), so node 1 and
 * the first virtio-mem device can yield the same numbers. The host address
 * of the access tells the backends apart: the plugin reads it from the
 * hwaddr handle (QEMU 7.2's struct qemu_plugin_hwaddr: two bools, then the
 * host pointer at offset 8) and finds each backend's mapping by its file
 * name in /proc/self/maps, so GPA = ram GPA + (host - mapping base). Every
 * 256th access per vCPU re-checks that phys_addr - host stays constant per
 * backend (check_mismatch counts any that do not: a wrong struct layout).
 *
 * Export: OUT is a little-endian u64 array, rewritten in place (readers
 * snapshot and diff; the plugin never knows intervals):
 *   [0] magic "TIERTRU1"   [1] version 1        [2] header bytes (1024)
 *   [3] page size 4096     [4] line size 64     [5] llc bytes
 *   [6] llc ways           [7] llc sets         [8] ranges n (<= 16)
 *   [9] pages n (sum)      [10] seq (+1 per 10 ms beat) [11] beat ns
 *   [12] state 1 running, 2 exited              [13] instructions
 *   [14] other RAM touches [15] other RAM misses (RAM outside the ranges)
 *   [16] MMIO accesses     [17] accesses with no hwaddr
 *   [18] check samples     [19] check mismatches
 *   [32 + 2r] range r start GPA, [33 + 2r] its length (page multiples)
 *   [64 + r] phys_addr() - GPA seen on range r (i64; i64::MIN: no sample)
 *   byte 1024: touches[pages n], then misses[pages n]; range r's pages
 *   follow range r-1's.
 */
#include <glib.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MAGIC 0x3155525452454954ull /* "TIERTRU1" */
#define HDR_BYTES 1024
#define PAGE_SHIFT 12
#define LINE_SHIFT 6
#define MAX_RANGES 16
#define CHECK_EVERY 256
#define NO_DELTA INT64_MIN

enum {
    H_MAGIC, H_VERSION, H_HDR, H_PAGE, H_LINE, H_LLC_BYTES, H_LLC_WAYS,
    H_LLC_SETS, H_RANGES, H_PAGES, H_SEQ, H_BEAT_NS, H_STATE, H_INSNS,
    H_OTHER_TOUCH, H_OTHER_MISS, H_IO, H_NOHW, H_CHECKS, H_MISMATCH,
    H_RANGE0 = 32, H_PHYS0 = 64,
};

/* Mirror of QEMU 7.2's internal struct qemu_plugin_hwaddr (RAM arm). */
struct hwaddr_7_2 {
    bool is_io;
    bool is_store;
    void *hostaddr;
};

struct range {
    uint64_t gpa, len, first_page;
    char *file;
    uintptr_t host;   /* mapping base, 0 until found */
    int64_t delta;    /* phys_addr - host; NO_DELTA until the first check */
};

/* Per-vCPU, one cache line each: only that vCPU's thread writes. */
struct vcpu {
    uint64_t insns;
    uint64_t accesses;
    char pad[48];
};

static struct range ranges[MAX_RANGES];
static unsigned n_ranges;
static uint64_t *hdr, *touches, *misses;
static size_t map_bytes;
static struct vcpu *vcpus;
static unsigned n_vcpus;
static uint64_t *tags;   /* sets x ways line tags, MRU first; 0 = empty */
static uint32_t *locks;  /* one spinlock per set */
static uint64_t n_sets, n_ways;
static GMutex maps_lock;
static bool maps_done;
static pthread_t beat_thread;
static volatile bool stopping;

static inline void add(uint64_t *p, uint64_t v)
{
    __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

/* benches/src/twin/llc.rs mix(): the same set hash as the twin. */
static inline uint64_t mix(uint64_t x)
{
    uint64_t z = x * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    z *= 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 32);
}

/* True on a miss (the line is filled, evicting the set's LRU). */
static bool llc_miss(uint64_t line)
{
    uint64_t s = mix(line) % n_sets, tag = line + 1;
    uint64_t *set = tags + s * n_ways;
    uint32_t *lk = locks + s;
    uint64_t i;

    while (__atomic_exchange_n(lk, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(lk, __ATOMIC_RELAXED)) {
            __builtin_ia32_pause();
        }
    }
    for (i = 0; i < n_ways && set[i] != tag; i++) {
    }
    bool miss = i == n_ways;
    if (miss) {
        i = n_ways - 1;
    }
    memmove(set + 1, set, i * sizeof(*set));
    set[0] = tag;
    __atomic_store_n(lk, 0, __ATOMIC_RELEASE);
    return miss;
}

/* Finds every backend's mapping in /proc/self/maps (once, at first use:
 * the plugin loads before the machine maps its RAM). */
static void find_maps(void)
{
    g_mutex_lock(&maps_lock);
    if (!maps_done) {
        FILE *f = fopen("/proc/self/maps", "r");
        char line[4096];
        while (f && fgets(line, sizeof(line), f)) {
            uintptr_t lo, hi;
            unsigned long long off;
            int name = 0;
            if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %llx %*s %*s %n",
                       &lo, &hi, &off, &name) < 3 || !name) {
                continue;
            }
            char *path = line + name;
            path[strcspn(path, "\n")] = 0;
            char *del = strstr(path, " (deleted)");
            if (del) {
                *del = 0;
            }
            for (unsigned r = 0; r < n_ranges; r++) {
                if (!ranges[r].host && !strcmp(path, ranges[r].file)) {
                    ranges[r].host = lo - off;
                }
            }
        }
        if (f) {
            fclose(f);
        }
        for (unsigned r = 0; r < n_ranges; r++) {
            if (!ranges[r].host) {
                fprintf(stderr, "tier_truth: %s is not mapped by QEMU: give "
                        "the backend mem-path=%s\n", ranges[r].file,
                        ranges[r].file);
                exit(1);
            }
        }
        __atomic_store_n(&maps_done, true, __ATOMIC_RELEASE);
    }
    g_mutex_unlock(&maps_lock);
}

static void check(struct range *r, struct qemu_plugin_hwaddr *hw, uintptr_t h)
{
    int64_t d = (int64_t)(qemu_plugin_hwaddr_phys_addr(hw) - h);
    int64_t seen = NO_DELTA;
    add(&hdr[H_CHECKS], 1);
    if (__atomic_compare_exchange_n(&r->delta, &seen, d, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        __atomic_store_n(&hdr[H_PHYS0 + (r - ranges)],
                         (uint64_t)(d + (int64_t)r->host - (int64_t)r->gpa),
                         __ATOMIC_RELAXED);
    } else if (seen != d) {
        add(&hdr[H_MISMATCH], 1);
    }
}

static void on_mem(unsigned int vcpu, qemu_plugin_meminfo_t info,
                   uint64_t vaddr, void *udata)
{
    struct qemu_plugin_hwaddr *hw = qemu_plugin_get_hwaddr(info, vaddr);
    if (!hw) {
        add(&hdr[H_NOHW], 1);
        return;
    }
    if (qemu_plugin_hwaddr_is_io(hw)) {
        add(&hdr[H_IO], 1);
        return;
    }
    if (!__atomic_load_n(&maps_done, __ATOMIC_ACQUIRE)) {
        find_maps();
    }
    uintptr_t h = (uintptr_t)((struct hwaddr_7_2 *)hw)->hostaddr;
    struct vcpu *v = &vcpus[vcpu % n_vcpus];
    bool sample = ++v->accesses % CHECK_EVERY == 0;
    for (unsigned i = 0; i < n_ranges; i++) {
        struct range *r = &ranges[i];
        uint64_t off = h - r->host;
        if (h >= r->host && off < r->len) {
            uint64_t page = r->first_page + (off >> PAGE_SHIFT);
            add(&touches[page], 1);
            if (llc_miss((r->gpa + off) >> LINE_SHIFT)) {
                add(&misses[page], 1);
            }
            if (sample) {
                check(r, hw, h);
            }
            return;
        }
    }
    /* ROM, BIOS, VGA RAM or a backend not given: host lines, never GPA
     * lines of a range, so they still compete in the cache. */
    add(&hdr[H_OTHER_TOUCH], 1);
    if (llc_miss((1ull << 63) | (h >> LINE_SHIFT))) {
        add(&hdr[H_OTHER_MISS], 1);
    }
}

static void on_tb_exec(unsigned int vcpu, void *udata)
{
    struct vcpu *v = &vcpus[vcpu % n_vcpus];
    __atomic_store_n(&v->insns, v->insns + (uintptr_t)udata, __ATOMIC_RELAXED);
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_tb_exec, QEMU_PLUGIN_CB_NO_REGS,
                                         (void *)(uintptr_t)n);
    for (size_t i = 0; i < n; i++) {
        qemu_plugin_register_vcpu_mem_cb(qemu_plugin_tb_get_insn(tb, i), on_mem,
                                         QEMU_PLUGIN_CB_NO_REGS,
                                         QEMU_PLUGIN_MEM_RW, NULL);
    }
}

static void publish(uint64_t state)
{
    uint64_t sum = 0;
    struct timespec ts;
    for (unsigned i = 0; i < n_vcpus; i++) {
        sum += __atomic_load_n(&vcpus[i].insns, __ATOMIC_RELAXED);
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    __atomic_store_n(&hdr[H_INSNS], sum, __ATOMIC_RELAXED);
    __atomic_store_n(&hdr[H_BEAT_NS],
                     (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&hdr[H_STATE], state, __ATOMIC_RELAXED);
    __atomic_fetch_add(&hdr[H_SEQ], 1, __ATOMIC_RELEASE);
}

static void *beat(void *arg)
{
    struct timespec tick = { 0, 10 * 1000 * 1000 };
    while (!stopping) {
        publish(1);
        nanosleep(&tick, NULL);
    }
    return NULL;
}

static void on_exit_cb(qemu_plugin_id_t id, void *p)
{
    stopping = true;
    pthread_join(beat_thread, NULL);
    publish(2);
}

static int fail(const char *what, const char *arg)
{
    fprintf(stderr, "tier_truth: %s: %s\n", what, arg);
    return -1;
}

static int parse_ram(const char *v)
{
    char *end;
    struct stat st;
    if (n_ranges == MAX_RANGES) {
        return fail("more than 16 ram= arguments", v);
    }
    uint64_t gpa = strtoull(v, &end, 0);
    if (*end != ':' || gpa & ((1 << PAGE_SHIFT) - 1)) {
        return fail("ram= wants PAGE_ALIGNED_GPA:FILE", v);
    }
    if (stat(end + 1, &st) || st.st_size <= 0) {
        return fail("ram= file missing or empty (create it before QEMU)", v);
    }
    struct range *r = &ranges[n_ranges++];
    r->gpa = gpa;
    r->len = (uint64_t)st.st_size & ~((1ull << PAGE_SHIFT) - 1);
    r->file = g_strdup(end + 1);
    r->delta = NO_DELTA;
    return 0;
}

static int map_out(const char *out, uint64_t llc_bytes)
{
    uint64_t pages = 0;
    for (unsigned r = 0; r < n_ranges; r++) {
        ranges[r].first_page = pages;
        pages += ranges[r].len >> PAGE_SHIFT;
    }
    map_bytes = HDR_BYTES + 2 * pages * sizeof(uint64_t);
    int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)map_bytes)) {
        return fail("cannot create out file", out);
    }
    hdr = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (hdr == MAP_FAILED) {
        return fail("cannot mmap out file", out);
    }
    touches = hdr + HDR_BYTES / sizeof(uint64_t);
    misses = touches + pages;
    hdr[H_VERSION] = 1;
    hdr[H_HDR] = HDR_BYTES;
    hdr[H_PAGE] = 1 << PAGE_SHIFT;
    hdr[H_LINE] = 1 << LINE_SHIFT;
    hdr[H_LLC_BYTES] = llc_bytes;
    hdr[H_LLC_WAYS] = n_ways;
    hdr[H_LLC_SETS] = n_sets;
    hdr[H_RANGES] = n_ranges;
    hdr[H_PAGES] = pages;
    for (unsigned r = 0; r < n_ranges; r++) {
        hdr[H_RANGE0 + 2 * r] = ranges[r].gpa;
        hdr[H_RANGE0 + 2 * r + 1] = ranges[r].len;
        hdr[H_PHYS0 + r] = (uint64_t)NO_DELTA;
    }
    /* Last: a reader that sees the magic sees a complete header. */
    __atomic_store_n(&hdr[H_MAGIC], MAGIC, __ATOMIC_RELEASE);
    return 0;
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id,
                                           const qemu_info_t *info,
                                           int argc, char **argv)
{
    const char *out = NULL;
    uint64_t llc_kib = 32 << 10;
    n_ways = 16;
    for (int i = 0; i < argc; i++) {
        char *v = strchr(argv[i], '=');
        if (!v) {
            return fail("argument is not KEY=VALUE", argv[i]);
        }
        size_t k = (size_t)(v++ - argv[i]);
        if (!strncmp(argv[i], "out", k) && k == 3) {
            out = v;
        } else if (!strncmp(argv[i], "ram", k) && k == 3) {
            if (parse_ram(v)) {
                return -1;
            }
        } else if (!strncmp(argv[i], "llc_kib", k) && k == 7) {
            llc_kib = strtoull(v, NULL, 0);
        } else if (!strncmp(argv[i], "llc_ways", k) && k == 8) {
            n_ways = strtoull(v, NULL, 0);
        } else {
            return fail("unknown argument (out, ram, llc_kib, llc_ways)",
                        argv[i]);
        }
    }
    if (!out || !n_ranges) {
        return fail("needs out=PATH and at least one ram=GPA:FILE", "");
    }
    if (!info->system_emulation) {
        return fail("system emulation only", info->target_name);
    }
    uint64_t llc_bytes = llc_kib << 10;
    n_sets = llc_bytes >> LINE_SHIFT;
    n_sets = n_ways ? n_sets / n_ways : 0;
    if (!n_sets) {
        return fail("LLC smaller than one set", "llc_kib/llc_ways");
    }
    tags = g_new0(uint64_t, n_sets * n_ways);
    locks = g_new0(uint32_t, n_sets);
    n_vcpus = info->system.max_vcpus > 0 ? info->system.max_vcpus : 1;
    vcpus = g_new0(struct vcpu, n_vcpus);
    if (map_out(out, llc_bytes)) {
        return -1;
    }
    publish(1);
    if (pthread_create(&beat_thread, NULL, beat, NULL)) {
        return fail("cannot start the heartbeat thread", out);
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
    return 0;
}
