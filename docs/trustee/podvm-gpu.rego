# podvm-gpu: a Trustee attestation-service policy fragment that releases secrets only to a pod
# VM whose GPUs podvm-gpu attested in this boot (docs/interface.md 3.14, docs/operating.md
# "Binding the GPUs' verdict to the TEE").
#
# Read against Trustee v0.15.0 (its TDX verifier replays the CCEL and the attestation-agent's
# log against the RTMRs and gives each entry as input.tdx.uefi_event_logs[i], with
# details.data.{domain, operation, content} for an AAEL event). Merge the rules into your own
# policy (package policy) and use podvm_gpu_attested where a claim must depend on the GPUs,
# for example:
#
#     hardware := 2 if { ...your TDX checks...; podvm_gpu_attested }
#
# The rule: the FIRST event extended into RTMR3 (index 4) is podvm-gpu's GpuAttestation with
# result "pass", at least podvm_gpu_min_gpus GPUs and CC mode "on" or "ppcie" (not dev-tools),
# and no podvm-gpu event says "fail". A
# later forged "pass" adds nothing (it is not first); a real later "fail" (the boot failed
# after attesting, or a rerun failed) revokes. A boot that died before it wrote anything leaves
# no podvm-gpu event: refused.
package policy

import rego.v1

# Edit: the fewest GPUs a pod VM must have attested.
podvm_gpu_min_gpus := 1

podvm_gpu_rtmr3 := [e |
	some e in input.tdx.uefi_event_logs
	e.index == 4
	e.type_name != "EV_NO_ACTION"
]

podvm_gpu_is_ours(e) if {
	e.type_name == "EV_EVENT_TAG"
	e.details.data.domain == "podvm-gpu"
	e.details.data.operation == "GpuAttestation"
}

podvm_gpu_results := [r |
	some e in podvm_gpu_rtmr3
	podvm_gpu_is_ours(e)
	r := json.unmarshal(e.details.data.content).result
]

default podvm_gpu_attested := false

podvm_gpu_attested if {
	first := podvm_gpu_rtmr3[0]
	podvm_gpu_is_ours(first)
	said := json.unmarshal(first.details.data.content)
	said.result == "pass"
	said.gpus >= podvm_gpu_min_gpus
	said.cc_mode in {"on", "ppcie"} # not dev-tools mode (no production confidentiality)
	every r in podvm_gpu_results {
		r != "fail"
	}
}
