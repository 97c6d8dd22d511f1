"""A job image's own sitecustomize, for the tests of goodput-instrument: goodput-instrument's sitecustomize must run
it (chaining). It also forces an exception inside probes, named in GOODPUT_TEST_FAULTS as `probe:N` (raise on the
Nth measurement of that probe), to show that a failing probe changes nothing in the job, logs one line, and leaves
the other probes reporting. It writes nothing of its own but the marker variable GOODPUT_TEST_CHAINED."""

import os

os.environ["GOODPUT_TEST_CHAINED"] = "1"


def _inject() -> None:
    wanted = dict(item.split(":") for item in os.environ.get("GOODPUT_TEST_FAULTS", "").split(",") if ":" in item)
    if not wanted:
        return
    from goodput_client.instrument.probes import PROBES

    # where each probe's own code runs, inside its guard
    points = {"steps": "ended", "eval": "evaluated", "flops": "measured",  # flops: the source each step reads
              "backward": "_report"}
    for probe_class in PROBES:
        if probe_class.name not in wanted:
            continue
        point = points.get(probe_class.name, "measure_end")
        original = getattr(probe_class, point)
        fail_at = int(wanted[probe_class.name])
        calls = [0]

        def faulty(self, *args, _original=original, _calls=calls, _fail_at=fail_at, _name=probe_class.name):
            _calls[0] += 1
            if _calls[0] == _fail_at:
                raise RuntimeError(f"fault injected into probe {_name}")
            return _original(self, *args)

        setattr(probe_class, point, faulty)


_inject()
