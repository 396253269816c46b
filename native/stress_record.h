/*
 * The record both stress tests move (stress.c through the queue, stress_rb.c through the
 * replay buffers): who wrote it, its sequence number, a checksum of the two, and a
 * payload filled from the checksum. A copy mixed from two records, or a slot read while
 * it was being written, fails intact(). Define STRESS_PAYLOAD (bytes) before including.
 * Also the xorshift64* generator each test thread draws its own choices from.
 */
#ifndef STRESS_RECORD_H
#define STRESS_RECORD_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t source, seq, check; /* source: the producer or writer thread */
    uint8_t payload[STRESS_PAYLOAD];
} record_t;

static uint64_t checksum(uint64_t source, uint64_t seq) {
    uint64_t x = source * 0x9e3779b97f4a7c15ull ^ (seq + 0x632be59bd9b4e019ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 29);
}

static void fill(record_t *r, uint64_t source, uint64_t seq) {
    r->source = source;
    r->seq = seq;
    r->check = checksum(source, seq);
    memset(r->payload, (int)(r->check & 0xff), sizeof r->payload);
}

static bool intact(const record_t *r) {
    if (r->check != checksum(r->source, r->seq)) return false;
    for (size_t i = 0; i < sizeof r->payload; i++)
        if (r->payload[i] != (uint8_t)(r->check & 0xff)) return false;
    return true;
}

/* xorshift64*: each thread draws its own choices (batch sizes, timeouts) from its state. */
static uint64_t next_random(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545f4914f6cdd1dull;
}

#endif
