// NCCL's point-to-point semantics, played, so that an order of sends, receives and waits is
// proven deadlock-free on NCCL before any rank runs it: the pipeline executor's
// (pp/nccl_order.c) and the CP ring's (cp/cp.c). On NCCL a communicator's operations run one
// after another on its stream: a send or receive starts when every earlier one on its stream
// has finished, and finishes once its match on the peer has started too (the k-th send from a
// to b meets b's k-th receive from a). The host posts without waiting and blocks only in a wait
// for an operation's completion. Where every operation of a rank shares one stream (one
// communicator for the group, as titan's cuda backend had), a send waiting for its peer blocks
// the receive queued behind it; with a stream per peer and direction (P2P_CHANNELS, what
// comm_p2p_ring builds) only the messages of one channel wait for each other, in order. The
// model takes each stream to progress on its own: NCCL's kernels on different communicators
// must be able to run at once (NCCL documents that they may not, and that a device-wide
// synchronization while one waits can hang), which the GPU runs are to confirm.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    P2P_SEND,  // to peer, the message `message`, on stream `stream`
    P2P_RECV,  // from peer
    P2P_WAIT,  // the host blocks until operation `op` (this rank's step index) has finished
} P2pKind;

typedef struct {
    P2pKind kind;
    int peer;         // SEND, RECV
    int64_t message;  // SEND, RECV: what it carries; a matched pair must name the same
    int stream;       // SEND, RECV: the stream (communicator) it runs on, 0 .. P2P_MAX_STREAMS-1
    int op;           // WAIT
} P2pStep;

#define P2P_MAX_STREAMS 512

// Which stream each operation of a rank runs on.
typedef enum {
    P2P_ONE_STREAM,  // all on one (one communicator for the group)
    P2P_CHANNELS,    // one per peer and direction (a communicator per ordered pair of ranks)
} P2pStreams;

// The stream of an operation with peer, sending or receiving, under policy.
int p2p_stream(P2pStreams policy, int peer, bool send);

// One rank's steps, in host order.
typedef struct {
    P2pStep *steps;
    int n, cap;
} P2pProgram;

// Appends a step; returns its index (a WAIT's op names a SEND or RECV by it).
int p2p_add(P2pProgram *p, P2pStep step);
void p2p_program_free(P2pProgram *p);

// Plays every rank's program (programs[ranks]) under the semantics above: true when all run to
// the end; else false with one line in err naming the stuck rank and step, an operation with
// no match, or a pair whose matched messages differ.
bool p2p_check_nccl(const P2pProgram *programs, int ranks, char *err, size_t n);
