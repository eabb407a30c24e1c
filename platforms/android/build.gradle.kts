// The toolledger Android library module: the UniFFI Kotlin bindings
// (package dev.toolledger) plus libtoolledger.so for every Android ABI.
//
// Not self-contained on purpose: plugin versions come from the app that
// includes this module (settings.gradle.kts of the app):
//
//     include(":toolledger")
//     project(":toolledger").projectDir = file("<path to toolledger>/platforms/android")
//
// Before the first Gradle build, run platforms/android/build-rust.sh: it
// cross-compiles the Rust library into src/main/jniLibs/<abi>/ and generates
// the Kotlin bindings into src/main/uniffi/ (both generated, never committed).
// See README.md beside this file.

plugins {
    id("com.android.library")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "dev.toolledger"
    compileSdk = 35

    defaultConfig {
        minSdk = 24
        // R8 keep rules for JNA and the generated bindings, applied to every
        // app that depends on this module.
        consumerProguardFiles("consumer-rules.pro")
        ndk {
            // The ABIs build-rust.sh produces.
            abiFilters += listOf("arm64-v8a", "armeabi-v7a", "x86_64", "x86")
        }
    }

    sourceSets {
        getByName("main") {
            // The generated UniFFI Kotlin file (dev/toolledger/toolledger.kt),
            // written by build-rust.sh. A java source dir is compiled by the
            // Kotlin plugin as well.
            java.srcDir("src/main/uniffi")
            // libtoolledger.so per ABI, written by cargo-ndk (the default
            // location, stated for clarity).
            jniLibs.srcDir("src/main/jniLibs")
        }
    }

    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }

    packaging {
        jniLibs {
            // Keep .so files uncompressed and page-aligned in the APK (the
            // default since AGP 3.6 with minSdk >= 23); loaded in place.
            useLegacyPackaging = false
        }
    }
}

kotlin {
    compilerOptions {
        jvmTarget.set(org.jetbrains.kotlin.gradle.dsl.JvmTarget.JVM_17)
    }
}

dependencies {
    // JNA loads libtoolledger.so and marshals every call. The @aar carries
    // JNA's own libjnidispatch.so for the Android ABIs (the plain jar has
    // only desktop natives).
    implementation("net.java.dev.jna:jna:5.17.0@aar")
    // The generated code implements async exports and the foreign async
    // ToolHandler with kotlinx.coroutines.
    implementation("org.jetbrains.kotlinx:kotlinx-coroutines-core:1.10.2")
}
