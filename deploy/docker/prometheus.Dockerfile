# Prometheus from Debian 12's package, for docker-compose.yml: the same
# base image as Sluice's (so it builds offline from build-images.sh's
# debootstrap base), with the project's config and rules mounted by compose.
# Users who pull can use prom/prometheus instead; the config is the same.
ARG BASE_IMAGE=debian:12
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
LABEL org.opencontainers.image.title="Prometheus for Sluice" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
# Ready once the config is loaded and the TSDB is open (GET /-/ready); the
# image has no HTTP client, bash's /dev/tcp is enough.
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /-/ready HTTP/1.0\\r\\n\\r\\n' >&3 && head -1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.listen-address=0.0.0.0:9090", "--web.enable-lifecycle"]
