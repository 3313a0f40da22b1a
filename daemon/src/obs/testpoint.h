/*
 * Fault injection for the disconnect, checkpoint and connection tests, never set in production:
 * ZEROD_TEST_PAUSE=<phase>:<ms> makes the daemon sleep at that phase ("step": before a step's
 * first collective; "allgather": after the first bucket's all-gather; "ckpt": at each stage of a
 * save; "ckptread": in a load, between verifying the files and reading them; "accept": on the
 * loop thread, just after a connection is accepted, as a long callback would hold the loop) and
 * log it, so that a test can kill a process or damage a file exactly there. "noidle" pauses
 * nothing: the runner does no idle work, so that what it would have done early is done where it
 * is needed.
 */
#ifndef ZD_TESTPOINT_H
#define ZD_TESTPOINT_H

#include <stdbool.h>
#include <stdint.h>

/* Sleep here when ZEROD_TEST_PAUSE names `phase` (job_id, or NULL, and step: for the log
 * line). */
void zd_test_pause(const char *phase, const char *job_id, uint64_t step);
/* Does ZEROD_TEST_PAUSE name `phase`? */
bool zd_test_phase(const char *phase);

#endif
