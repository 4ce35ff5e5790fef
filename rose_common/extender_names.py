"""Names the scheduler extender reads from pods, shared so the controller and SDK can write them.

Only the extender defines these; components that set them (the ElasticRLJob controller on worker
pods, the SDK at safe points) import them from here.
"""

from __future__ import annotations

from typing import Final

from rose_common.names import LABEL_PREFIX

# Seconds of uninterrupted run an RL worker needs to be worth placing (pod annotation, integer).
# The extender filters out nodes whose pool the forecast says serving will need sooner.
ANNOTATION_MIN_RUN: Final = f"{LABEL_PREFIX}/min-useful-run-seconds"
# "true" while an RL worker sits at a safe point (the SDK sets and clears it): reclaiming such a
# GPU costs no grace period.
ANNOTATION_AT_SAFE_POINT: Final = f"{LABEL_PREFIX}/at-safe-point"
# Number of GPUs an RL worker pod needs (set by the controller; default 1 per lendable claim).
ANNOTATION_GPUS: Final = f"{LABEL_PREFIX}/gpus"
# Event reason recorded on an RL pod whose preemption the extender turned into a suspend request.
EVENT_REASON_SUSPEND_REQUESTED: Final = "SuspendRequested"
EXTENDER_COMPONENT: Final = "rose-scheduler-extender"
# How the extender's filter reason for a pool whose forecast does not cover a worker's minimum useful
# run begins ("serving forecast (at risk 0.05) needs pool 'p' within 0s < min useful run 10s");
# kube-scheduler copies it into the pod's PodScheduled=False (Unschedulable) condition message, where
# the controller reads it (elastic_controller.observe: a granted worker refused this long is removed).
REFUSAL_SERVING_FORECAST: Final = "serving forecast"
