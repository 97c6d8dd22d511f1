"""The committed pod-resources modules are what `make proto` generates from the committed .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PROTO = "exporter/sources/kubelet/podresources_v1.proto"


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    (tmp_path / "exporter" / "sources" / "kubelet").mkdir(parents=True)
    (tmp_path / PROTO).write_text((ROOT / PROTO).read_text())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.",
                    "--grpc_python_out=.", PROTO], cwd=tmp_path, check=True)
    for name in ("podresources_v1_pb2.py", "podresources_v1_pb2_grpc.py"):
        generated = (tmp_path / "exporter" / "sources" / "kubelet" / name).read_text()
        committed = (ROOT / "exporter" / "sources" / "kubelet" / name).read_text()
        assert generated == committed, f"{name} is stale: run `make proto`"


def test_service_path_is_the_kubelets() -> None:
    from exporter.sources.kubelet import podresources_v1_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"  # the kubelet serves /v1.PodResourcesLister/List
    fields = {f.name: f.number for f in pb.ContainerDevices.DESCRIPTOR.fields}
    assert fields == {"resource_name": 1, "device_ids": 2, "topology": 3}


def test_dra_messages_follow_current_kubernetes() -> None:
    from exporter.sources.kubelet import podresources_v1_pb2 as pb

    dynamic = {f.name: f.number for f in pb.DynamicResource.DESCRIPTOR.fields}
    assert dynamic == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}  # class_name (1) removed
    claim = {f.name: f.number for f in pb.ClaimResource.DESCRIPTOR.fields}
    assert claim == {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4}
    # an older kubelet's class_name still decodes (as an unknown field)
    old = b"\x0a\x03gpu\x12\x05claim"  # class_name="gpu", claim_name="claim"
    assert pb.DynamicResource.FromString(old).claim_name == "claim"
