#!/usr/bin/env bash
# titan --print-schedule: the pipeline schedule the config names, checked and printed as a
# table with its bubble and live activations, without MPI; the microbatch count from the batch
# config or --microbatches; DualPipeV runs (2pp+1 live on every rank) and refuses fewer
# microbatches than stages; a broken CSV schedule exits 2 with one line naming rank and action.
source "$(dirname "$0")/lib.sh"
PP=(--config configs/debug_model.yaml --parallelism.pipeline_parallel_degree 4)

$TITAN "${PP[@]}" --print-schedule --microbatches 8 >"$SCRATCH/1f1b.txt" ||
  fail "--print-schedule 1F1B did not exit 0"
grep -q "^step  rank 0    rank 1    rank 2    rank 3$" "$SCRATCH/1f1b.txt" || fail "no table header"
grep -q "^legend: Fs.m forward of stage s, microbatch m; .*; ~ a B's second unit; . idle$" \
  "$SCRATCH/1f1b.txt" || fail "no legend for the table's ~ and ."
grep -Eq "^   0  F0.0 " "$SCRATCH/1f1b.txt" || fail "rank 0 does not start with F0.0"
grep -q "^ok: deadlock-free" "$SCRATCH/1f1b.txt" || fail "no verdict"
grep -q "^bubble: 0.2727 " "$SCRATCH/1f1b.txt" || fail "1F1B pp=4 m=8 bubble is not 3/11"
grep -q "^peak live activations per rank: 4 3 2 1$" "$SCRATCH/1f1b.txt" || fail "peak live"
grep -q "^activation regions per rank (training): 4 3 2 1$" "$SCRATCH/1f1b.txt" || fail "regions"
grep -q "^receives in send order (what NCCL needs): yes$" "$SCRATCH/1f1b.txt" || fail "order"
grep -q "^runs on NCCL (a stream per peer and direction): yes$" "$SCRATCH/1f1b.txt" ||
  fail "no NCCL verdict"
# local_batch_size 8 in microbatches of 2: 4 microbatches
$TITAN "${PP[@]}" --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatch_size 2 \
  --parallelism.pipeline_parallel_schedule ZBVZeroBubble --print-schedule |
  grep -q "^schedule ZBVZeroBubble: 4 ranks, 8 stages, 4 microbatches$" ||
  fail "microbatches not taken from the batch config"
$TITAN "${PP[@]}" --parallelism.pipeline_parallel_schedule DualPipeV --print-schedule \
  --microbatches 8 >"$SCRATCH/dualpipev.txt" || fail "--print-schedule DualPipeV did not exit 0"
grep -q "^schedule DualPipeV: 4 ranks, 8 stages, 8 microbatches$" "$SCRATCH/dualpipev.txt" ||
  fail "no DualPipeV title"
# rank 3 holds stages 3 and 4: the V turns there with no communication
grep -Eq "^   4  F0.4 +F1.3 +F2.2 +F4.0$" "$SCRATCH/dualpipev.txt" ||
  fail "DualPipeV's step 4 is not F0.4 F1.3 F2.2 F4.0 (the V's turn on rank 3)"
grep -q "^ok: deadlock-free" "$SCRATCH/dualpipev.txt" || fail "no DualPipeV verdict"
grep -q "^peak live activations per rank: 9 9 9 9$" "$SCRATCH/dualpipev.txt" ||
  fail "DualPipeV pp=4 does not keep 2pp+1 = 9 live on every rank"
echo "ok: tables, verdict, bubble, microbatches from the config, DualPipeV"

printf '0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n' >"$SCRATCH/ok.csv"
CSV=(--config configs/debug_model.yaml --parallelism.pipeline_parallel_degree 2 --microbatches 1)
$TITAN "${CSV[@]}" --parallelism.pipeline_parallel_schedule_csv "$SCRATCH/ok.csv" \
  --print-schedule | grep -q "^ok: deadlock-free" || fail "a good CSV is refused"
printf '0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n' >"$SCRATCH/norecv.csv"
expect_user_error "norecv.csv: rank 1, action 0 \(F1.0\): runs before its input" \
  $TITAN "${CSV[@]}" --parallelism.pipeline_parallel_schedule_csv "$SCRATCH/norecv.csv" \
  --print-schedule
printf '0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n' >"$SCRATCH/swapped.csv"
expect_user_error "deadlock: rank 0 is stuck at action 0 \(RECV_B0.0\)" \
  $TITAN "${CSV[@]}" --parallelism.pipeline_parallel_schedule_csv "$SCRATCH/swapped.csv" \
  --print-schedule
# Stage 2 on rank 3: rank 1 would send to a rank that is not its mesh neighbour.
printf '0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1SEND_F0,1RECV_B0,1B0,1SEND_B0\n\n2RECV_F0,2F0,2B0,2SEND_B0\n' \
  >"$SCRATCH/far.csv"
expect_user_error "far.csv: rank 1, action 2 \(SEND_F1.0\): rank 3 is not a pipeline neighbour of rank 1" \
  $TITAN "${PP[@]}" --parallelism.pipeline_parallel_schedule_csv "$SCRATCH/far.csv" \
  --print-schedule --microbatches 1
expect_user_error "Interleaved1F1B needs the microbatch count \(6\) to be a multiple" \
  $TITAN "${PP[@]}" --parallelism.pipeline_parallel_schedule Interleaved1F1B --print-schedule \
  --microbatches 6
expect_user_error "DualPipeV needs at least as many microbatches \(6\) as stages \(2 x" \
  $TITAN "${PP[@]}" --parallelism.pipeline_parallel_schedule DualPipeV --print-schedule \
  --microbatches 6
expect_user_error "^titan: error: --microbatches is only for --print-schedule" \
  $TITAN "${PP[@]}" --microbatches 4
echo "ok: broken schedules refused with one line"
