"""Copies one rendered file to a host over SSH; re-runs only when the content's sha256 changes."""

from __future__ import annotations

import hashlib
import shlex

import pulumi
from pulumi_command import remote

__all__ = ["deploy_file", "sha256_of", "sudo_prefix"]


def sha256_of(content: pulumi.Input[str]) -> pulumi.Output[str]:
    """sha256 of the text; stays secret when the content is (the hash would not leak much, but be strict)."""
    return pulumi.Output.from_input(content).apply(lambda c: hashlib.sha256(c.encode()).hexdigest())


def sudo_prefix(user: str) -> str:
    return "" if user == "root" else "sudo -n "


def deploy_file(
    name: str,
    *,
    connection: remote.ConnectionArgs,
    user: str,
    path: str,
    content: pulumi.Input[str],
    owner: str = "root:root",
    mode: str = "0644",
    check: str | None = None,
    opts: pulumi.ResourceOptions,
) -> tuple[remote.Command, pulumi.Output[str]]:
    """Write `content` to `path` atomically (temp file + rename) so a daemon never reads half a file.

    `check` is a command run on the temp file (its path in `$tmp`) before the rename: when it fails the
    deploy fails and the file in place, the one the daemon serves, is left as it was. `pulumi destroy`
    removes the file (unless someone changed it since), and its directory when nothing else is left in it.
    """
    s = sudo_prefix(user)
    q = shlex.quote
    directory = path.rsplit("/", 1)[0] or "/"
    script = (
        "set -eu; umask 077; "
        f"{s}mkdir -p {q(directory)}; "
        f'tmp=$({s}mktemp {q(directory + "/.coldstart.XXXXXX")}); '
        f"trap '{s}rm -f \"$tmp\"' EXIT; "
        f'{s}tee "$tmp" >/dev/null; '
        + (f"{s}{check}; " if check else "")
        + f'{s}chown {q(owner)} "$tmp"; {s}chmod {q(mode)} "$tmp"; '
        f'{s}mv -f "$tmp" {q(path)}'
    )
    digest = sha256_of(content)
    cmd = remote.Command(
        name,
        connection=connection,
        create=script,
        # A content change replaces the resource (triggers), new one first: the old one's delete must not
        # remove the file its successor just wrote, so it removes only a file that still holds its content.
        delete=digest.apply(
            lambda d: f'if [ "$({s}sha256sum {q(path)} 2>/dev/null | cut -c1-64)" = {d} ]; then '
                      f"{s}rm -f {q(path)}; {s}rmdir {q(directory)} 2>/dev/null || true; fi"
        ),
        # Content goes over stdin, not the command line: no quoting bugs, no secret in `ps`.
        stdin=content,
        # Owner and mode are in the script: a change to them updates in place (a replacement with the same
        # content would have the old resource's delete remove the file).
        triggers=[digest, path],
        opts=opts,
    )
    return cmd, digest
