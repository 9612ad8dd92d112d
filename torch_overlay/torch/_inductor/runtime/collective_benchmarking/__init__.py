"""Rank-consistent benchmarking of autotuning choices that contain collectives.

The protocol by which every rank of a process group benchmarks the same
candidates in lock-step, agrees on their timings and leaves with the same
decision, on any device and backend.  Every step is a collective on the
group's benchmark channel, a c10d group of its own, and is bounded; it
starts no thread and opens no connection to the job's store.  It reads no
Inductor IR; Inductor's adapters (``torch/_inductor/collective_autotuning/``)
sit on top of it.  Its modules, from the bottom up; each imports only
modules listed before it:

* ``types.py``: the values the layers pass to one another: an op to tune, its
  candidates, the configuration, the errors;
* ``decisions.py``: what a decision is made of: statuses, results, the decision
  and its JSON, failure reports and the rules that blame one step;
* ``rules.py``: the rules that make a decision: pure functions of what the
  members agreed on;
* ``groups.py``: the process group an op names, and its topology;
* ``known_crashes.py``: the collectives known to crash their process on some
  backend and device, which no candidate may call there;
* ``gloo_hazards.py``: the candidates that could crash a gloo process,
  disqualified before they run (fork only);
* ``timing.py``: device-agnostic timing;
* ``channel_builder.py``: a channel, built by c10d as a members-only group;
* ``channels.py``: the private process groups a session runs on, and its
  bounded steps;
* ``reporting.py``: each decision in the trace (a tlparse artifact) and in
  TORCH_LOGS, with why each candidate won or lost;
* ``decision_cache.py``: decisions remembered across compiles and processes, and
  the sessions a compiled program took part in;
* ``join.py``: the pre-sync, which agrees on what a session benchmarks;
* ``failures.py``: how a session's members agree on a failed step, and on each
  candidate's result;
* ``session.py``: warmups, interleaved timed runs, exchange, commit;
* ``benchmarker.py``: the orchestrator, a session from the join to the decision
  (``CollectiveBenchmarker``), and the module that documents the protocol.
"""
