"""Who holds each GPU: kubelet pod-resources, the launcher environment of GPU processes, precedence."""
