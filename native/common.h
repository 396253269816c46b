/*
 * common.h: what rq.c (the queue and the counters) and rb.c (the replay buffers) share,
 * besides atomic64.h's float add: the cache-line sizes of their layouts, rounding,
 * the monotonic clock, the spin-then-yield rounds that come before a wait sleeps,
 * deadlines, and the liveness checks behind the policies for owners that die holding a
 * slot.
 *
 * Included by rq.c and rb.c only (and through them by the stress tests, stress.c and
 * stress_rb.c, which include the .c files). Only header-private (static inline)
 * definitions, so each includer compiles its own copy and leaves out what it does not
 * use; like atomic64.h, this file is not part of the cffi declarations.
 *
 * Nothing here orders memory: the stamps, fences and counters of each file do, and
 * their comments say how.
 *
 * Alike but not shared, because they differ: each file's pthread_atfork handler (rq.c
 * counts fork generations, which retire its per-thread cache of registry entries; rb.c
 * forgets its cached pid) and how a wait sleeps after the rounds below.
 */
#ifndef NATIVE_COMMON_H
#define NATIVE_COMMON_H

/* syscall (SYS_tgkill), kill and clock_gettime are outside strict C11 (-std=c11). */
#ifndef _GNU_SOURCE
#error "define _GNU_SOURCE before the first #include (rq.c and rb.c do)"
#endif

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to work across processes");

/* ---- layout ---- */

#define LINE 128      /* separate hot fields by two cache lines: adjacent-line prefetch */
#define SLOT_ALIGN 64 /* slots start on, and are rounded to, one cache line */

static inline uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* ---- time ---- */

/* CLOCK_MONOTONIC, in nanoseconds: the clock of every deadline and of rq.c's watches. */
static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* The deadline of a wait of `timeout_ns` from now; -1 for no limit (timeout_ns < 0, or
 * so large that now + timeout_ns would overflow). */
static inline int64_t deadline_of(int64_t timeout_ns) {
    int64_t now = now_ns();
    return timeout_ns < 0 || timeout_ns > INT64_MAX - now ? -1 : now + timeout_ns;
}

static inline bool expired(int64_t deadline) { return deadline >= 0 && now_ns() >= deadline; }

/* ---- waiting: spin, then yield, then sleep ----
 * A call that has to wait first spins SPIN_ROUNDS rounds, then yields the core
 * YIELD_ROUNDS times, trying again after each round; only then does it sleep. How it
 * sleeps is each file's own: rq.c on a futex word that the other side wakes, rb.c in
 * naps, since its writers never wake anyone. */
#define SPIN_ROUNDS 64
#define YIELD_ROUNDS 16

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Before sleeping, spin a little (the other side is often running on another core and
 * about to make room or publish), then yield the core a few times (other runnable
 * threads may be the ones we wait for). Returns false once it is time to sleep. */
static inline bool keep_spinning(int round) {
    if (round < SPIN_ROUNDS) {
        cpu_relax();
        return true;
    }
    if (round < SPIN_ROUNDS + YIELD_ROUNDS) {
        sched_yield();
        return true;
    }
    return false;
}

/* ---- whether the owner of a slot is still alive ----
 * rq.c and rb.c take over a slot whose owner died before handing it on, so both ask
 * whether an owner still runs; they ask about different things, so there are two
 * checks, which differ in the signal probe and share the /proc half:
 *   thread_alive   rq.c's registries hold threads (pid << 32 | tid), because a queue's
 *                  claims are announced and undone per thread. Probe: tgkill(pid, tid, 0);
 *                  any failure but EPERM means dead, EPERM means alive at once.
 *   process_alive  rb.c's stamps hold processes: from Python a thread cannot die inside
 *                  a C call while its process lives. Probe: kill(pid, 0); only ESRCH
 *                  means dead, and every other answer (EPERM too) goes on to /proc.
 * A thread or process that answers the probe is still dead if /proc shows it a zombie
 * (a killed process stays one until its parent reaps it). */

/* The /proc half: alive unless the `stat` file at `path` shows state Z (zombie) or X
 * (dead). No /proc view of it (another PID namespace, /proc not mounted): assume alive,
 * the safe answer (its slot is only left alone longer). */
static inline bool stat_says_alive(const char *path) {
    char buf[256];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return true;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* the state letter follows "pid (comm) " */
    return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* Alive unless the thread is gone or its process is a zombie waiting to be reaped. */
static inline bool thread_alive(pid_t pid, pid_t tid) {
    if (syscall(SYS_tgkill, pid, tid, 0) != 0) return errno == EPERM;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
    return stat_says_alive(path);
}

/* A process is alive unless it is gone or a zombie waiting to be reaped. */
static inline bool process_alive(pid_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return false;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return stat_says_alive(path);
}

#endif
