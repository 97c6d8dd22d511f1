"""The committed pod-resources modules are what `make proto` generates from the committed .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PROTO = "exporter/attribution/podresources_v1.proto"


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    (tmp_path / "exporter" / "attribution").mkdir(parents=True)
    (tmp_path / PROTO).write_text((ROOT / PROTO).read_text())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.",
                    "--grpc_python_out=.", PROTO], cwd=tmp_path, check=True)
    for name in ("podresources_v1_pb2.py", "podresources_v1_pb2_grpc.py"):
        generated = (tmp_path / "exporter" / "attribution" / name).read_text()
        committed = (ROOT / "exporter" / "attribution" / name).read_text()
        assert generated == committed, f"{name} is stale: run `make proto`"


def test_service_path_is_the_kubelets() -> None:
    from exporter.attribution import podresources_v1_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"  # the kubelet serves /v1.PodResourcesLister/List
    fields = {f.name: f.number for f in pb.ContainerDevices.DESCRIPTOR.fields}
    assert fields == {"resource_name": 1, "device_ids": 2, "topology": 3}
