// Every thread's stack, taken from a running process without stopping it: the debug server's
// /stacks (core/debug_server.h).
//
// The caller lists the process's threads (/proc/self/task) and sends each a real-time signal
// (rt_tgsigqueueinfo, the slot index in the signal's value). The handler records its thread's
// return addresses with glibc's backtrace() into that slot; the caller waits for the slots (a
// thread that blocks the signal, or is stuck in the kernel, is reported as not answering after
// THREAD_STACKS_WAIT_S) and names the addresses with elfutils' libdw, which reads each loaded
// object's whole symbol table, so static functions are named too.
//
// A thread interrupted in a system call resumes it (SA_RESTART) or sees EINTR where the call
// is never restarted (nanosleep, epoll_wait), as under any signal; titan's waits handle EINTR.
#pragma once

#include <stdio.h>

#define THREAD_STACKS_WAIT_S 1.0

// Installs the handler (the signal is SIGRTMIN + 4, which nothing else in titan uses) and makes
// the first backtrace() call, which loads libgcc's unwinder (not safe inside a handler).
void thread_stacks_init(void);
// One block per thread: 'thread <tid> "<name>"', then one line per frame, innermost first:
// '  #<i> 0x<address> <function>+0x<offset> (<object>)'. One caller at a time.
void thread_stacks_write(FILE *f);
