# Adds podvm-gpu to a pod VM image. Works with Debian's packer 1.6.6 and with current Packer
# (which also needs plugins.pkr.hcl for the qemu builder; see docs/install.md, "Packer").
#
# Two sources, one sequence of steps:
#   qemu.podvm     boots an existing pod VM disk image (qcow2 with python3 and the NVIDIA
#                  driver, toolkit and modules already in it) and installs over SSH.
#   null.image-dir installs into an image that is a directory on this machine (a rootfs built
#                  by mmdebstrap/debootstrap, an unpacked image), as root, with systemd-nspawn.
# Every build ends with "podvm-gpu check --image" in the image: a build whose image cannot run
# the agent (unit not enabled, no nvidia modules for its kernel, driver versions that differ,
# nvidia-cdi-refresh still enabled, ...) fails.
#
#   packer build -only=null.image-dir -var image_dir=/path/to/rootfs packer/
#   packer build -only=qemu.podvm -var base_image=podvm.qcow2 -var ssh_password=... packer/

variable "bundle_dir" {
  type        = string
  default     = "build/podvm-gpu-bundle"
  description = "Where systemd/make-bundle.sh puts the agent's wheels, units and installer on this machine."
}

variable "image_dir" {
  type        = string
  default     = ""
  description = "null.image-dir: the image's root directory."
}

variable "base_image" {
  type        = string
  default     = "podvm-base.qcow2"
  description = "qemu.podvm: the pod VM disk image to add the agent to."
}

variable "base_image_checksum" {
  type    = string
  default = "none"
}

variable "output_directory" {
  type    = string
  default = "build/podvm-gpu-image"
}

variable "disk_size" {
  type    = string
  default = "6G"
}

variable "ssh_username" {
  type    = string
  default = "peerpod"
}

variable "ssh_password" {
  type      = string
  default   = ""
  sensitive = true
}

variable "ssh_private_key_file" {
  type    = string
  default = ""
}

locals {
  repo      = "${path.root}/.."
  in_bundle = "/tmp/podvm-gpu-bundle"
  as_root   = "chmod +x {{ .Path }}; sudo sh -c '{{ .Vars }} {{ .Path }}'"
}

source "null" "image-dir" {
  communicator = "none"
}

source "qemu" "podvm" {
  disk_image           = true
  iso_url              = var.base_image
  iso_checksum         = var.base_image_checksum
  output_directory     = var.output_directory
  vm_name              = "podvm-gpu.qcow2"
  format               = "qcow2"
  disk_size            = var.disk_size
  headless             = true
  ssh_username         = var.ssh_username
  ssh_password         = var.ssh_password
  ssh_private_key_file = var.ssh_private_key_file
  ssh_timeout          = "15m"
  shutdown_command     = "sudo shutdown -P now"
}

build {
  sources = ["source.null.image-dir", "source.qemu.podvm"]

  # On this machine: the agent as wheels (with every dependency), units and installer.
  provisioner "shell-local" {
    inline = ["sh '${local.repo}/systemd/make-bundle.sh' '${var.bundle_dir}' '${local.repo}'"]
  }

  provisioner "shell-local" {
    only   = ["null.image-dir"]
    inline = ["sh '${local.repo}/systemd/install-into-root.sh' '${var.image_dir}' '${var.bundle_dir}'"]
  }

  provisioner "file" {
    only        = ["qemu.podvm"]
    source      = "${var.bundle_dir}/"
    destination = local.in_bundle
    generated   = true # made by the first step, not there when the template is validated
  }

  provisioner "shell" {
    only            = ["qemu.podvm"]
    execute_command = local.as_root
    inline = [
      "sh ${local.in_bundle}/install-podvm-gpu.sh",
      "rm -rf ${local.in_bundle}",
    ]
  }

  # Last: the image check. Read-only; a failed check fails the build.
  provisioner "shell-local" {
    only   = ["null.image-dir"]
    inline = ["systemd-nspawn --quiet --register=no --keep-unit --directory='${var.image_dir}' /opt/podvm-gpu/bin/podvm-gpu check --image"]
  }

  provisioner "shell" {
    only            = ["qemu.podvm"]
    execute_command = local.as_root
    inline          = ["/opt/podvm-gpu/bin/podvm-gpu check --image"]
  }
}
