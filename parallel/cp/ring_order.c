// The alltoall ring's posting order (cp.c's forward_ring and backward_ring) as rank's
// point-to-point program (parallel/p2p_check.h): each step here is what those functions post
// and wait for, in their order; the two change together. Messages: forward K/V of ring step i
// 4i, backward K/V 4i + 1, the dK/dV sent on at step i 4i + 2.
#include "parallel/cp/cp.h"

static int add(P2pProgram *p, P2pKind kind, int peer, int64_t message, P2pStreams streams) {
    return p2p_add(p, (P2pStep){.kind = kind, .peer = peer, .message = message,
                                .stream = p2p_stream(streams, peer, kind == P2P_SEND)});
}

static void wait_for(P2pProgram *p, int op) {
    if (op >= 0) p2p_add(p, (P2pStep){.kind = P2P_WAIT, .op = op});
}

void cp_ring_program(int rank, int size, P2pStreams streams, P2pProgram *p) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (int i = 0; i < size; i++) {  // forward_ring
        int send = -1, recv = -1;
        if (i + 1 < size) {
            send = add(p, P2P_SEND, next, 4 * i, streams);
            recv = add(p, P2P_RECV, prev, 4 * i, streams);
        }
        wait_for(p, send);  // after the unit's compute
        wait_for(p, recv);
    }
    int dsend[2] = {-1, -1};
    for (int i = 0; i < size; i++) {  // backward_ring
        int drecv = i > 0 ? add(p, P2P_RECV, prev, 4 * (i - 1) + 2, streams) : -1;
        int send = -1, recv = -1;
        if (i + 1 < size) {
            send = add(p, P2P_SEND, next, 4 * i + 1, streams);
            recv = add(p, P2P_RECV, prev, 4 * i + 1, streams);
        }
        wait_for(p, dsend[i % 2]);
        wait_for(p, drecv);  // after the unit's compute
        dsend[i % 2] = add(p, P2P_SEND, next, 4 * i + 2, streams);
        wait_for(p, send);
        wait_for(p, recv);
    }
    wait_for(p, add(p, P2P_RECV, prev, 4 * (size - 1) + 2, streams));  // this rank's dK/dV home
    wait_for(p, dsend[0]);
    wait_for(p, dsend[1]);
}
