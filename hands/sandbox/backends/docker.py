"""The Docker backend (the ``sandbox`` extra: the ``docker`` SDK): a container per binding, named
by its identity and labelled with the binding (``io.tendon.sandbox.*``), its workspace a named
volume of the same name mounted at ``/workspace``. The container runs ``sleep infinity``; commands
are ``docker exec``s, so a command outlives the Hands worker that started it, and the operation
log it writes is in the volume.

The identity is the container's name: the engine refuses a second container of that name (409),
so a creation whose reply was lost and is made again cannot make two. The SDK is synchronous:
each call runs in a thread.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import tarfile
from collections.abc import Callable
from typing import Any, TypeVar

from hands.sandbox.backends.base import AlreadyExistsError, ProviderError
from hands.sandbox.rules.errors import SandboxGoneError
from hands.sandbox.rules.paths import inside

T = TypeVar("T")
WORKSPACE = "/workspace"


class DockerBackend:
    kind = "docker"

    def __init__(self, *, image: str, network: str, client: Any = None) -> None:
        self.image = image
        self.network = network
        self._client = client

    def config(self) -> dict[str, Any]:
        return {"backend": "docker", "image": self.image, "network": self.network}

    def _docker(self) -> Any:
        if self._client is None:
            try:
                import docker
            except ImportError as exc:  # pragma: no cover - the extra is not installed
                raise ProviderError(
                    "the Docker backend needs the 'sandbox' extra (pip install docker)"
                ) from exc
            try:
                self._client = docker.from_env()
            except docker.errors.DockerException as exc:  # the engine is not there (yet)
                raise ProviderError(f"Docker engine unreachable: {exc}") from exc
        return self._client

    async def _call(self, fn: Callable[[], T], *, creating: bool = False, lookup: bool = False) -> T:
        """``fn`` in a thread, its errors as the backend's: NotFound passes only for a ``lookup``
        (a missing image, say, is the provider refusing); a 409 is a held identity only when
        ``creating``."""
        from docker.errors import APIError, DockerException, NotFound
        from requests.exceptions import RequestException  # the SDK lets its transport's errors through

        try:
            return await asyncio.to_thread(fn)
        except NotFound as exc:
            if lookup:
                raise
            raise ProviderError(f"Docker engine: {exc.explanation or exc}") from exc
        except APIError as exc:
            if creating and exc.status_code == 409:  # the name is taken: the identity is held
                raise AlreadyExistsError(str(exc.explanation or exc)) from exc
            raise ProviderError(f"Docker engine: {exc.explanation or exc}") from exc
        except (DockerException, RequestException, OSError) as exc:
            raise ProviderError(f"Docker engine unreachable: {exc}") from exc

    async def _container(self, identity: str) -> Any:
        from docker.errors import NotFound

        try:
            return await self._call(lambda: self._docker().containers.get(identity), lookup=True)
        except NotFound as exc:
            raise SandboxGoneError(f"container {identity} is gone") from exc

    async def find(self, identity: str) -> dict[str, str] | None:
        from docker.errors import NotFound

        try:
            container = await self._call(lambda: self._docker().containers.get(identity), lookup=True)
        except NotFound:
            return None
        return dict(container.labels or {})

    async def create(self, identity: str, labels: dict[str, str]) -> None:
        client = self._docker()
        await self._call(lambda: client.volumes.create(name=identity, labels=labels))
        container = await self._call(
            lambda: client.containers.create(
                self.image,
                ["sleep", "infinity"],
                name=identity,
                labels=labels,
                detach=True,
                volumes={identity: {"bind": WORKSPACE, "mode": "rw"}},
                working_dir=WORKSPACE,
                network_mode=self.network,
            ),
            creating=True,
        )
        await self._call(container.start)

    async def resume(self, identity: str) -> None:
        container = await self._container(identity)
        if container.status != "running":
            await self._call(container.start)

    async def delete(self, identity: str) -> None:
        from docker.errors import NotFound

        client = self._docker()
        for remove in (
            lambda: client.containers.get(identity).remove(force=True),
            lambda: client.volumes.get(identity).remove(force=True),
        ):
            try:
                await self._call(remove, lookup=True)
            except NotFound:
                pass  # gone already: a deletion repeated after a crash

    async def shell(self, identity: str, script: str) -> tuple[int, bytes]:
        container = await self._container(identity)
        result = await self._call(
            lambda: container.exec_run(["sh", "-c", script], workdir=WORKSPACE, demux=True)
        )
        out, _ = result.output if result.output is not None else (None, None)
        return result.exit_code or 0, out or b""

    async def write_file(self, identity: str, path: str, data: bytes) -> None:
        rel = inside(path)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            parts = rel.split("/")
            for depth in range(1, len(parts)):  # its folders, made as the archive is unpacked
                folder = tarfile.TarInfo("/".join(parts[:depth]))
                folder.type, folder.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(folder)
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        container = await self._container(identity)
        await self._call(lambda: container.put_archive(WORKSPACE, buffer.getvalue()))

    async def read_file(self, identity: str, path: str, offset: int = 0, limit: int = -1) -> bytes | None:
        quoted = shlex.quote(inside(path))
        head = f" | head -c {limit}" if limit >= 0 else ""
        code, out = await self.shell(
            identity, f"[ -f {quoted} ] || exit 3; tail -c +{offset + 1} {quoted}{head}"
        )
        return None if code == 3 else out
