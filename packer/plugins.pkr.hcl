# Current Packer (1.7 and later) loads the qemu builder as an external plugin: run
# "packer init packer/" once. Debian's packer 1.6.6 has the builder built in and rejects this
# block, so leave this file out there (the tests validate the other files with 1.6.6).
packer {
  required_version = ">= 1.7.0"
  required_plugins {
    qemu = {
      source  = "github.com/hashicorp/qemu"
      version = ">= 1.1.0"
    }
  }
}
