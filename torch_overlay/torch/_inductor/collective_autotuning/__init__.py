"""Collective autotuning in Inductor: its choices benchmarked by every rank alike.

The adapters between Inductor and the protocol of
``torch/_inductor/runtime/collective_benchmarking/``, which never imports
them.  Its modules, from the bottom up; each imports only the protocol and
modules listed before it:

* ``settings.py``: the sessions' settings, read from ``torch._inductor.config``
  and checked there.
* ``collective_graphs.py``: the collectives a choice's graph issues, their
  group;
* ``choices.py``: Inductor's choices as candidates, and V1's entry point, which
  ``select_algorithm`` calls while it lowers an op;
* ``inlining.py``: a V2 node replaced by its winner's graph;
* ``epilogue.py``: V2's timing of a candidate together with its pointwise epilogue;
* ``deferral.py``: V2's lowering: an op's choices deferred to the scheduler in one
  node;
* ``deferred_tuning.py``: V2 in the scheduler: each group's deferred nodes tuned
  in one session per graph;
* ``cache_hits.py``: cached programs that replay the sessions their compile took part
  in, so that every rank agrees on a cache hit.

On gloo (fork only), ``collective_graphs.py`` also counts the collectives a
graph keeps in flight at once.
"""
