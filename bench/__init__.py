"""The hermes-sandbox benchmark: every transport and backend against the reference design.

Run ``scripts/bench`` (or ``python -m bench``) from the repository: it measures each
case in :mod:`bench.cases`, with the reference's RPC shapes (:mod:`bench.baselines`)
measured in the same run on the same machine, prints a table with the issue's targets
beside their figures, and writes the same figures to a JSON file. ``--quick`` runs
every case with tiny counts, to prove the harness still works. docs/benchmarks.md has
the latest full table and what the profiles showed.
"""
