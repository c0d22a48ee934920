"""Compiling and running what the passes produce: targets, runners, default schedules, pipelines, tuning.

- :mod:`.host`: the host CPU, ``TVM_COMBINERS_MCPU`` and the LLVM options a target gets;
- :mod:`.relax_runner`, :mod:`.relay_runner`: targets, build, run and op counts for each IR;
- :mod:`.schedules`: the default llvm schedule rules (dlight ``ScheduleRule`` classes);
- :mod:`.legalize`, :mod:`.pipelines`: the Relax pipelines the package compiles with;
- :mod:`.tuning`: MetaSchedule for ``--tune``;
- :mod:`.interrupts`: Ctrl-C kept a KeyboardInterrupt through TVM's calls.

Importing this package imports none of them: each IR's TVM lives in its own environment.
"""
