"""``podvm-gpu watch``: after a boot that ended ``ready`` with GPUs, watch the GPUs and take a
GPU that fails out of the CDI spec for every container created after (issue 34).

kata-agent reads ``/var/run/cdi`` afresh at every CreateContainer, so the spec the boot
installed decides every later container of the pod. The watcher follows the kernel log as it
arrives (:mod:`podvm_gpu.host.kmsg_follow`: blocking reads, no busy polling, from the position
the boot reached), polls the recovery action, the memory health and the fabric state every
``watch.interval_s`` on a thread of its own (one poll at a time: a hung nvidia-smi is ended by
its timeout and never piles up), and looks at the daemons. What a record or an answer means is
decided by the boot's own judgements (:mod:`podvm_gpu.watch.verdicts`).

On a fatal finding (:func:`apply_finding`), under ``/run/podvm-gpu/boot.lock``: the spec is
replaced atomically by the unavailable spec naming the GPU, the finding and its time; in a
confidential guest the ready state is set back (``nvidia-smi conf-compute -srs 0``); status.json
becomes ``failed`` with a reason starting ``watch:`` and ``cdi`` null; the finding is kept in
``/run/podvm-gpu/watch.json`` (:mod:`podvm_gpu.watchfile`) with the kernel log position; one
journal line and one console line say it. Containers created before keep their device nodes:
no agent can revoke those.

Never a false alarm from the watcher itself: a fact it cannot read is a warning, records from
before the boot are not findings, a finding about a GPU the spec does not hold is a warning.
"""
