// Pipeline schedules as data: each rank's ordered list of actions, produced by a generator
// (GPipe, 1F1B, LoopedBFS, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV)
// or read from torchtitan's CSV format, and a checker that runs every rank's list as a
// communicating process before any rank trains. Pure host code: no collectives, no model.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "parallel/p2p_check.h"

typedef enum {
    PP_FORWARD,
    PP_BACKWARD_INPUT,   // I: the gradient of the stage's input (what the previous stage waits for)
    PP_BACKWARD_WEIGHT,  // W: the gradient of the stage's weights (may be deferred into bubbles)
    PP_BACKWARD,         // B: I and W together
    PP_SEND_ACT,         // stage's output activation to the rank of stage + 1
    PP_RECV_ACT,         // stage's input activation from the rank of stage - 1
    PP_SEND_GRAD,        // stage's input gradient to the rank of stage - 1
    PP_RECV_GRAD,        // stage's output gradient from the rank of stage + 1
} PpActionKind;

typedef struct {
    PpActionKind kind;
    int stage;       // virtual stage index, 0 .. stages-1
    int microbatch;  // 0 .. microbatches-1
    int peer;        // the other rank of a send/recv; -1 for compute
} PpAction;

typedef struct {
    int ranks, stages, microbatches;
    bool forward_only;  // evaluation: forwards (and their sends and recvs) only
    int *stage_rank;    // (stages) the rank that holds each virtual stage
    int *count;         // (ranks) actions per rank
    int *capacity;      // (ranks) allocated actions per rank
    PpAction **actions; // (ranks) each rank's ordered actions
} PpSchedule;

// What the checker proves and measures. Cost model (unit times, communication free): F = 1,
// I = 1, W = 1, B = I + W = 2, the ratio the zero-bubble paper (Qi et al. 2023) and the 1F1B
// analysis use, under which GPipe and 1F1B idle exactly (pp-1)/(m+pp-1) of the time.
typedef struct {
    int ranks;
    int64_t makespan;   // time of the last action to finish
    int64_t busy;       // compute time summed over ranks
    int64_t idle;       // ranks * makespan - busy
    double bubble;      // idle / (ranks * makespan)
    int *peak_live;     // (ranks) most (stage, microbatch) forwarded and not yet fully backwarded
                        // (B, or W after I: the weight gradient still needs the saved input)
    int64_t **start;    // (ranks)(count[rank]) each action's start time in the cost model
} PpReport;

// Generates the named schedule (parallelism.pipeline_parallel_schedule's spelling) for pp
// ranks, m microbatches and v stages per rank (0: the schedule's own, 1 for GPipe and 1F1B,
// 2 for the others; GPipe and 1F1B run 1, the V-shaped ZBVZeroBubble and DualPipeV 2, the
// looped ones any v >= 2) into s; false with one line in err for an unknown name or a
// microbatch or stage count the schedule cannot run (never a schedule that hangs).
bool pp_schedule_generate(PpSchedule *s, const char *name, int pp, int m, int v, char *err,
                          size_t n);
// Evaluation's schedule on train's placement (its ranks, stages and stage_rank) for m
// microbatches: every rank runs each microbatch through its stages in stage order, forward
// only (torchtitan's eval step, GPipe's forward half).
void pp_schedule_forward_only(PpSchedule *s, const PpSchedule *train, int m);
// Reads torchtitan's CSV schedule (one row per rank, cells like 0F1, 1I0, 1W0, 2B3, 1SEND_F0,
// 2RECV_B1; empty cells are idle steps). A file with only compute actions gets its sends and
// recvs added, as torchtitan does; one with any send/recv is taken as written.
bool pp_schedule_load_csv(PpSchedule *s, const char *text, const char *path, char *err,
                          size_t n);
void pp_schedule_free(PpSchedule *s);

// Whether rank's list runs backward in two parts (I, then W) rather than B.
bool pp_rank_splits_backward(const PpSchedule *s, int rank);

// Whether send (SEND_F or SEND_B) carries the message recv (RECV_F or RECV_B) takes.
bool pp_sends_message(const PpAction *send, const PpAction *recv);
// Whether every rank receives from each peer in the order that peer sends (what NCCL, which
// matches a pair's point-to-point operations in issue order, needs): generated schedules do;
// false with one line naming the rank and action of the first receive out of order.
bool pp_schedule_channels_in_order(const PpSchedule *s, char *err, size_t n);

// The cost model's time of one action (cost.c): 2 for B, 1 for F, I and W, 0 for sends and
// recvs.
int pp_action_cost(PpActionKind k);

// Runs every rank's list as a process: compute and sends never block (sends are buffered),
// a recv blocks until the matching send was made. Proves deadlock-freedom, that each (stage,
// microbatch) runs F once and B (or I and W) once in dependency order, and that every send is
// received; false with one line naming the rank and action otherwise. r->peak_live and
// r->start are allocated (pp_report_free) when the check passes.
bool pp_schedule_check(const PpSchedule *s, PpReport *r, char *err, size_t n);
void pp_report_free(PpReport *r);
// The same run with the executor's activation regions played too (regions[r] on rank r; see
// check.c): false with one line when a rank would wait forever or run out of regions.
bool pp_schedule_check_regions(const PpSchedule *s, const int *regions, char *err, size_t n);

// The executor's posting order (its sends, receives and waits, regions[r] on rank r) played
// under NCCL's semantics with the given streams (parallel/p2p_check.h): false with one line
// when the ranks would deadlock on NCCL.
bool pp_schedule_check_nccl(const PpSchedule *s, const int *regions, P2pStreams streams,
                            char *err, size_t n);

// "F3.1", "I0.2", "SEND_F1.0": the short name of an action (stage.microbatch).
const char *pp_action_name(const PpAction *a, char *buf, size_t n);
// The schedule as a table (one column per rank, one row per time step of the cost model),
// then the verdict, bubble and peak live activations per rank.
void pp_schedule_print(const PpSchedule *s, const PpReport *r, FILE *out);
