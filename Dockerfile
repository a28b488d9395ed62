# The product's image: the reconciler and the router, one image for both. They share their
# Python, their dependencies and the package, so a second image would hold the same layers
# twice, and with one image the reconciler renders its routers from the image it runs itself
# (MODELPOOL_ROUTER_IMAGE in manifests/deployment.yaml): one name to set, and a reconciler
# never renders a router of another release. The entrypoint is the reconciler; a router is
# the same image with the command `modelpool-router`.
#
# Built from the checkout by scripts/images (version and revision from pyproject.toml and
# git). By hand: docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse
# HEAD) -t modelpool .
#
#   BASE         a Python 3.11 image with pip: python:3.11-slim, or one built where no image
#                can be pulled (scripts/images --base)
#   PIP_OPTIONS  extra options of the pip that installs the checkout (scripts/images
#                --host-wheels: `--no-index --find-links /src/dist/wheels`)
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG PIP_OPTIONS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
COPY . /src
# A virtual environment without pip of its own, filled by the base's pip: the final stage
# copies it whole, on the same base, and carries neither the sources nor a build tool.
# Byte-compiled here: the pods' root filesystem is read-only. Both programs must start, and
# the reconciler find its templates (a router rendered from stdin).
RUN python3 -m venv --without-pip /opt/modelpool \
 && python3 -m pip --python /opt/modelpool/bin/python install ${PIP_OPTIONS} /src \
 && /opt/modelpool/bin/python -m compileall -q /opt/modelpool/lib \
 && /opt/modelpool/bin/modelpool-router --help >/dev/null \
 && printf '%s\n' 'apiVersion: modelpool.dev/v1alpha1' 'kind: ModelRouter' \
      'metadata: {name: r, namespace: n}' 'spec: {backends: [{name: b, url: "http://b"}]}' \
    | /opt/modelpool/bin/modelpool-reconciler render - | grep -q 'modelpool-router'

FROM ${BASE}
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/modelpool/modelpool
LABEL org.opencontainers.image.title="modelpool" \
      org.opencontainers.image.description="Share one exclusive GPU slot among several LLM model servers on Kubernetes: the reconciler (entrypoint) and the router (modelpool-router)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
ENV PATH=/opt/modelpool/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/modelpool /opt/modelpool
# Numeric, so the kubelet can check runAsNonRoot; the manifests run it as 1000 too. Neither
# program writes to its filesystem (the bytecode is compiled above): readOnlyRootFilesystem
# holds.
USER 1000:1000
EXPOSE 8080 9090
ENTRYPOINT ["modelpool-reconciler"]
