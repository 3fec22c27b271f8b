// Alternate signal stacks for titan's signal handlers: SIGTERM's preemption (core/preempt.h),
// SIGUSR1's flight recorder dump (parallel/comm.h) and the debug server's stack sampling
// (core/thread_stacks.h), each installed with SA_ONSTACK.
//
// oneDNN's JIT GEMM kernels (its dnnl_sgemm, titan's cpu fp32 GEMM; 2.6.3 as Debian ships it)
// keep data below the stack pointer past the 128 bytes the x86-64 ABI leaves there, so a
// handler's frame pushed onto the interrupted stack overwrites it: SIGUSR1 every 5 ms at a loop
// of dnnl_sgemm corrupted the heap within a second, in whichever thread took the signal. On an
// alternate stack the handler touches none of the interrupted one.
#pragma once

// Gives the calling thread an alternate signal stack (malloc'd, kept for the thread's life),
// once: later calls return at once. Every thread that may take one of titan's signals while in
// a kernel needs one: the installers call it for their thread (the main thread), and the cpu
// backend's init for each OpenMP thread.
void signal_stack_ensure(void);
