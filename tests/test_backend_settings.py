"""Typed backend settings: one class per backend, built once per run from the config
file, ``-o KEY=VALUE`` and the API, each bad value refused with its place."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from typing import Any

import pytest
from conftest import IMAGE, RUN_ID, TEST_LABEL, engine_problem, require

import hermes_sandbox
from hermes_sandbox import (
    BackendSettings,
    DaytonaSettings,
    DockerSettings,
    LocalSettings,
    ModalSettings,
    RunError,
    RunOptions,
    SettingError,
    SingularitySettings,
    SSHSettings,
    execute_code,
)
from hermes_sandbox.environments import (
    BACKEND_SETTINGS,
    BACKENDS,
    get_environment_class,
    get_settings_class,
)
from hermes_sandbox.environments.local import LocalEnvironment
from hermes_sandbox.environments.settings import config_place, parse_text

SETTINGS = {
    "local": LocalSettings,
    "docker": DockerSettings,
    "ssh": SSHSettings,
    "singularity": SingularitySettings,
    "modal": ModalSettings,
    "daytona": DaytonaSettings,
}


def test_one_settings_class_per_backend_each_naming_its_backend():
    assert list(BACKENDS)[: len(SETTINGS)] == list(SETTINGS)  # then any registered later
    assert list(BACKEND_SETTINGS) == list(SETTINGS)  # each read without its environment
    for name, cls in SETTINGS.items():
        assert get_settings_class(name) is cls
        assert get_environment_class(name).settings_class is cls
        assert cls.backend == name  # the discriminator
        assert issubclass(cls, BackendSettings) and dataclasses.is_dataclass(cls)
        assert cls.__name__ in hermes_sandbox.__all__
        assert getattr(hermes_sandbox, cls.__name__) is cls


def test_a_bad_value_is_refused_with_its_place():
    with pytest.raises(SettingError) as caught:
        DockerSettings(cpus=-1)
    assert str(caught.value) == "DockerSettings(cpus=-1.0): must be > 0, got -1.0"
    assert caught.value.field == "cpus"
    assert isinstance(caught.value, ValueError) and isinstance(
        caught.value, hermes_sandbox.ConfigError
    )
    with pytest.raises(SettingError, match=r"^DockerSettings\(cpus='abc'\): expected a number"):
        DockerSettings(cpus="abc")  # type: ignore[arg-type]
    place = config_place("docker", "/path/config.yaml")
    with pytest.raises(SettingError) as caught:
        DockerSettings.build([({"memory": "lots"}, place)])
    assert str(caught.value).startswith("backends.docker.memory in /path/config.yaml: must be")
    with pytest.raises(SettingError, match=r"^-o cpus=abc: expected a number, got 'abc'$"):
        DockerSettings.build(DockerSettings.parse_options(["cpus=abc"]))


def test_later_layers_win_and_a_bad_value_names_the_layer_that_gave_it():
    place = config_place("docker", "c.yaml")
    layers: list[Any] = [({"memory": "2g", "cpus": 2}, place)]
    built = DockerSettings.build([*layers, *DockerSettings.parse_options(["memory=none"])])
    assert built.memory is None and built.cpus == 2.0
    with pytest.raises(SettingError, match=r"^-o pids_limit=0: must be >= 1"):
        DockerSettings.build([*layers, *DockerSettings.parse_options(["pids_limit=0"])])
    with pytest.raises(SettingError, match=r"^backends.docker.cpus in c.yaml: must be > 0"):
        DockerSettings.build([({"cpus": 0}, place), *DockerSettings.parse_options(["user=me"])])


def test_options_text_is_read_by_each_fields_type():
    assert parse_text("2222", int) == 2222
    assert parse_text("1.5", float | None) == 1.5
    assert parse_text("none", float | None) is None
    assert parse_text("yes", bool) is True and parse_text("off", bool) is False
    assert parse_text("3.11", str) == "3.11"  # text stays text, never a number
    assert parse_text("/a:/b", tuple[str, ...]) == ("/a:/b",)
    assert parse_text("[/a:/b, /c:/d]", tuple[str, ...]) == ["/a:/b", "/c:/d"]
    for text, hint in (("abc", int), ("maybe", bool), ("x", float)):
        with pytest.raises(ValueError, match="expected"):
            parse_text(text, hint)
    built = DockerSettings.build(
        DockerSettings.parse_options(["mounts=/h:/c:rw", "labels={team: x}", "network=true"])
    )
    assert built.mounts[0].target == "/c" and not built.mounts[0].read_only
    assert built.labels == {"team": "x"} and built.network is True


def test_unknown_keys_and_credentials_are_refused_naming_what_to_do():
    with pytest.raises(SettingError, match=r"^-o memroy=1g: unknown docker backend setting"):
        DockerSettings.parse_options(["memroy=1g"])
    with pytest.raises(SettingError, match="needs KEY=VALUE"):
        DockerSettings.parse_options(["memory"])
    with pytest.raises(SettingError, match="DAYTONA_API_KEY in the environment"):
        DaytonaSettings.parse_options(["api_key=secret"])
    with pytest.raises(SettingError, match="the ssh backend needs a host"):
        SSHSettings.build([])


def test_image_and_network_flags_map_onto_each_backends_fields():
    assert DockerSettings.flag_layers(image="i", network=True)[0][0] == {"image": "i"}
    assert ModalSettings.flag_layers(image=None, network=True)[0][0] == {"block_network": False}
    assert DaytonaSettings.flag_layers(image=None, network=True)[0][0] == {
        "network_block_all": False
    }
    with pytest.raises(SettingError, match=r"^--image: the local backend runs no image"):
        LocalSettings.flag_layers(image="python:3.12", network=False)
    with pytest.raises(SettingError, match=r"^--image: the ssh backend runs no image"):
        SSHSettings.flag_layers(image="python:3.12", network=False)
    with pytest.raises(SettingError, match=r"^--network: the ssh backend has no network"):
        SSHSettings.flag_layers(image=None, network=True)


def test_network_and_isolation_flags_map_onto_the_local_settings():
    layers = LocalSettings.flag_layers(image=None, network=True, isolation="bwrap")
    built = LocalSettings.build(layers)
    assert (built.network, built.isolation) == (True, "bwrap")
    assert LocalSettings().network is False and LocalSettings().isolation is None
    with pytest.raises(SettingError, match=r"^--isolation bwrap: .*the docker backend has no"):
        DockerSettings.flag_layers(image=None, network=False, isolation="bwrap")
    with pytest.raises(SettingError, match=r"^--isolation jail: isolation must be one of"):
        LocalSettings.build(LocalSettings.flag_layers(image=None, network=False, isolation="jail"))
    with pytest.raises(SettingError, match=r"^LocalSettings\(isolation='jail'\)"):
        LocalSettings(isolation="jail")


def test_run_options_take_a_name_or_a_settings_object():
    options = RunOptions(backend=DockerSettings(image="x"), backend_options={"memory": "2g"})
    assert options.backend_name == "docker"
    settings = options.backend_settings()
    assert isinstance(settings, DockerSettings)
    assert (settings.image, settings.memory) == ("x", "2g")
    with pytest.raises(SettingError, match=r"^backend_options\['cpus'\]: must be > 0"):
        RunOptions(backend="docker", backend_options={"cpus": 0}).backend_settings()
    with pytest.raises(RunError, match=r"DockerSettings\(image=\.\.\.\)"):
        RunOptions(backend=42).validate()  # type: ignore[arg-type]
    with pytest.raises(SettingError, match="the local backend takes LocalSettings"):
        LocalEnvironment.for_run(
            DockerSettings(image="x"), env={}, kill_grace=1, task_id=None, python=None
        )


def test_local_python_setting_runs_the_script(tmp_path):
    record = tmp_path / "argv.txt"
    stand_in = tmp_path / "stand-in-python"
    python = os.path.realpath(sys.executable)
    stand_in.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$@" > {record}\nexec {python} "$@"\n')
    stand_in.chmod(0o755)
    result = execute_code("print('hi')", backend=LocalSettings(python=str(stand_in)), timeout=30)
    assert result.status == "success", result.output
    assert record.read_text().strip().endswith("script.py")


def test_execute_code_runs_in_docker_given_docker_settings():
    require(engine_problem(), "a run in a container needs a container engine")
    image = os.environ.get("HERMES_SANDBOX_DOCKER_IMAGE", IMAGE)
    workdir = f"/work-{RUN_ID}"
    settings = DockerSettings(image=image, labels={TEST_LABEL: RUN_ID}, workdir=workdir)
    result = execute_code(
        "import os, socket\nfrom hermes_tools import terminal\n"
        "print(os.getcwd(), socket.gethostname())\n"
        "print(terminal('pwd')['output'].strip())\n",
        backend=settings,
        timeout=120,
    )
    assert result.status == "success", result.output
    cwd, hostname, tool_cwd = result.output.split()
    assert cwd == tool_cwd == workdir  # the settings' workdir, in the container
    assert hostname != socket.gethostname()
