#!/usr/bin/env python3
"""Checks docker-compose.yml without a Docker engine.

- the file validates against the Compose Specification's JSON schema,
  vendored in deploy/schema/compose-spec.json;
- every file or folder it names exists: build contexts, Dockerfiles,
  bind-mounted sources, config and secret files, env files;
- every image is pinned to a version (a tag other than `latest`, or a
  digest) and none comes from the `bitnami/` namespace, whose versioned
  tags are no longer served; an image named beside a `build` is the name
  of what that build makes, and needs no tag.

Prints one line per check and a closing `N passed, N failed` line; exits
non-zero when any check fails. Usage: compose_check.py [COMPOSE_FILE]
"""
import json
import os
import sys

import jsonschema
import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
SCHEMA = os.path.join(ROOT, "deploy", "schema", "compose-spec.json")


def image_problem(image):
    """Why an image reference is not pinned to a maintained version, or None."""
    if image.startswith("bitnami/") or image.startswith("docker.io/bitnami/"):
        return "comes from the bitnami/ namespace, whose versioned tags are no longer served"
    if "@sha256:" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return "has no tag: it follows whatever upstream publishes next"
    tag = last.split(":", 1)[1]
    if tag in ("latest", "stable", "edge", "main", "master") or not any(c.isdigit() for c in tag):
        return f"is tagged {tag!r}, which is not a version"
    return None


def named_paths(doc, base):
    """(what, path) for every file or folder of the host the file names."""
    for name, svc in (doc.get("services") or {}).items():
        build = svc.get("build")
        if isinstance(build, str):
            build = {"context": build}
        if isinstance(build, dict):
            context = os.path.join(base, build.get("context", "."))
            yield f"service {name}: build context", context
            if "dockerfile" in build:
                yield f"service {name}: dockerfile", os.path.join(context, build["dockerfile"])
        for volume in svc.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith(".") or source.startswith("/"):
                yield f"service {name}: volume source", os.path.join(base, source)
        env_files = svc.get("env_file") or []
        for env in [env_files] if isinstance(env_files, str) else env_files:
            path = env if isinstance(env, str) else env.get("path")
            if isinstance(env, dict) and env.get("required") is False:
                continue
            yield f"service {name}: env_file", os.path.join(base, path)
    for section in ("configs", "secrets"):
        for name, item in (doc.get(section) or {}).items():
            if isinstance(item, dict) and "file" in item:
                yield f"{section[:-1]} {name}: file", os.path.join(base, item["file"])


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docker-compose.yml")
    base = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        doc = yaml.safe_load(f)
    with open(SCHEMA) as f:
        schema = json.load(f)
    passed, failed = 0, 0

    def check(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
        print(f"compose: {'ok  ' if ok else 'FAIL'} {what}")

    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    for error in errors:
        where = "/".join(str(p) for p in error.path) or "(top)"
        print(f"compose: schema error at {where}: {error.message}")
    check(not errors, f"{os.path.basename(path)} validates against the Compose Specification ({len(errors)} errors)")
    for what, named in named_paths(doc, base):
        check(os.path.exists(named), f"{what} {os.path.relpath(named, base)} exists")
    for name, svc in (doc.get("services") or {}).items():
        image = svc.get("image")
        if image is None:
            check("build" in svc, f"service {name} has an image or a build")
            continue
        problem = None if "build" in svc else image_problem(image)
        check(problem is None, f"service {name}: image {image}" + (f" {problem}" if problem else " is pinned"))
    print(f"compose: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
