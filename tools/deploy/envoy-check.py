#!/usr/bin/env python3
"""Validates an Envoy bootstrap YAML against Envoy's own API schema, without an envoy binary.

Used by tools/deploy/validate.sh (docs/DEPLOY.md, "What is validated"). Needs on sys.path:
xds-protos (the envoy.* / xds.* / udpa.* / validate.* protobuf modules generated from
envoyproxy/data-plane-api), protobuf, protoc-gen-validate (PGV's Python runtime), PyYAML.

What it does, in the order Envoy does it when it loads a bootstrap:

1. YAML -> dict; every `@type` of a typed_config (a google.protobuf.Any) is looked up, and the
   generated module of its proto package is imported so the type is registered. A type that no
   module defines is an error (Envoy: "Unable to parse JSON as proto ... unknown type").
2. protobuf's json_format.ParseDict into envoy.config.bootstrap.v3.Bootstrap, unknown fields
   refused (Envoy's strict static-config loading), the Any messages included: a misspelled
   field anywhere, a wrong type, an unknown enum name fails here.
3. protoc-gen-validate rules (the `validate.rules` annotations Envoy checks with
   MessageUtil::validate): required fields, duration / number bounds, enum defined_only, string
   lengths, repeated min_items, oneof required, on the Bootstrap and on every Any unpacked into
   its concrete type (Envoy validates each typed_config when it builds the extension).
4. Deprecated fields and enum values (`deprecated = true`): Envoy only warns about these, this
   check fails on them so the config stays on the current API.
5. Cross-references Envoy checks at start-up: every route's cluster is defined, and the HTTP
   filter chain ends with the router.

Exit 0 when all pass; prints one line per problem otherwise.
"""
import importlib
import os
import pkgutil
import sys

import yaml
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor

from envoy.config.bootstrap.v3 import bootstrap_pb2
from protoc_gen_validate import validator as pgv

TYPE_PREFIX = "type.googleapis.com/"


def walk_types(node, out):
    """Every `@type` in the YAML tree."""
    if isinstance(node, dict):
        t = node.get("@type")
        if isinstance(t, str):
            out.add(t)
        for v in node.values():
            walk_types(v, out)
    elif isinstance(node, list):
        for v in node:
            walk_types(v, out)


def register(type_url):
    """Imports the generated modules of type_url's proto package; True if the type is known."""
    if not type_url.startswith(TYPE_PREFIX):
        return False
    full = type_url[len(TYPE_PREFIX):]
    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName(full)
        return True
    except KeyError:
        pass
    package = full.rsplit(".", 1)[0]
    try:
        pkg = importlib.import_module(package)
    except ImportError:
        return False
    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name.endswith("_pb2"):
            importlib.import_module(f"{package}.{mod.name}")
    try:
        pool.FindMessageTypeByName(full)
        return True
    except KeyError:
        return False


def unpack(any_msg):
    desc = descriptor_pool.Default().FindMessageTypeByName(any_msg.type_url[len(TYPE_PREFIX):])
    msg = message_factory.GetMessageClass(desc)()
    any_msg.Unpack(msg)
    return msg


def visit(msg, path, fn):
    """Calls fn(msg, path) on msg and every message below it, unpacking Any."""
    fn(msg, path)
    for field, value in msg.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        is_map = field.message_type.GetOptions().map_entry
        if is_map:
            vdesc = field.message_type.fields_by_name["value"]
            if vdesc.type != FieldDescriptor.TYPE_MESSAGE:
                continue
            items = [(f"{path}.{field.name}[{k!r}]", v) for k, v in value.items()]
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            items = [(f"{path}.{field.name}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(f"{path}.{field.name}", value)]
        for p, v in items:
            if v.DESCRIPTOR.full_name == "google.protobuf.Any":
                inner = unpack(v)
                visit(inner, f"{p}<{inner.DESCRIPTOR.full_name}>", fn)
            else:
                visit(v, p, fn)


def main():
    path = sys.argv[1]
    with open(path) as f:
        config = yaml.safe_load(f)
    errors = []

    types = set()
    walk_types(config, types)
    for t in sorted(types):
        if not register(t):
            errors.append(f"unknown extension type {t} (no generated module defines it)")
    if errors:
        return report(path, errors)

    bootstrap = bootstrap_pb2.Bootstrap()
    try:
        json_format.ParseDict(config, bootstrap, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        return report(path, [f"schema: {e}"])

    rule_errors = []

    def check(msg, p):
        if msg.DESCRIPTOR.full_name == "google.protobuf.Any":
            return
        # PGV on every message: its runtime recurses into submessages but leaves an Any packed,
        # so visit() unpacks those; an error found again at an ancestor is reported once, below.
        try:
            pgv.validate_all(msg)
        except pgv.ValidationFailed as e:
            for line in str(e).splitlines():
                rule_errors.append((p, line))
        for field, value in msg.ListFields():
            if field.GetOptions().deprecated:
                errors.append(f"deprecated field: {p}.{field.name}")
            if field.type == FieldDescriptor.TYPE_ENUM:
                vals = value if field.label == FieldDescriptor.LABEL_REPEATED else [value]
                for v in vals:
                    ev = field.enum_type.values_by_number.get(v)
                    if ev is not None and ev.GetOptions().deprecated:
                        errors.append(f"deprecated enum value: {p}.{field.name} = {ev.name}")

    visit(bootstrap, "bootstrap", check)
    for p, line in rule_errors:
        # The deepest message that reports it, not each of its ancestors.
        if not any(q != p and q.startswith(p) and l == line for q, l in rule_errors):
            errors.append(f"rule: {p}: {line}")

    # Start-up cross-references.
    clusters = {c.name for c in bootstrap.static_resources.clusters}
    hcms = []

    def find_hcm(msg, p):
        if msg.DESCRIPTOR.full_name.endswith("http_connection_manager.v3.HttpConnectionManager"):
            hcms.append((p, msg))

    visit(bootstrap, "bootstrap", find_hcm)
    for p, hcm in hcms:
        for vh in hcm.route_config.virtual_hosts:
            for i, r in enumerate(vh.routes):
                c = r.route.cluster
                if r.HasField("route") and c and c not in clusters:
                    errors.append(f"{p}: route {vh.name}[{i}] names cluster {c!r}, not defined")
        names = [f.name for f in hcm.http_filters]
        if not names or names[-1] != "envoy.filters.http.router":
            errors.append(f"{p}: the last HTTP filter must be envoy.filters.http.router: {names}")

    if errors:
        return report(path, errors)
    print(f"ok: {os.path.basename(path)}: Bootstrap parsed strictly, {len(types)} extension types "
          f"({', '.join(t.rsplit('.', 1)[1] for t in sorted(types))}), PGV rules and deprecations "
          f"checked")
    return 0


def report(path, errors):
    for e in errors:
        print(f"{path}: {e}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
